"""The checkpoint directory layout: names, manifest validation, discovery and pruning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.checkpoint_dirs import make_checkpoint, make_checkpoint_v2
from worker_sdk.contract import layout
from worker_sdk.contract.layout import (
    DCP_METADATA,
    MANIFEST,
    MARKER,
    SHARED,
    CorruptCheckpointError,
    committed_name,
    rank_file,
    temp_name,
)

REPO = Path(__file__).resolve().parents[3]


def rewrite_manifest(path: Path, **changes: object) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest.update(changes)
    (path / MANIFEST).write_text(json.dumps(manifest))


def without_file(name: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        manifest = json.loads((path / MANIFEST).read_text())
        del manifest["files"][name]
        (path / MANIFEST).write_text(json.dumps(manifest))

    return change


def truncate(path: Path) -> None:
    with open(path / rank_file(1), "r+b") as f:
        f.truncate(5)


@pytest.mark.parametrize(
    ("made", "expected"),
    [
        (committed_name(0), "step-0000000000"),
        (committed_name(123), "step-0000000123"),
        (committed_name(9_999_999_999), "step-9999999999"),
        (temp_name(123, "a3"), ".tmp-step-0000000123-a3"),
        (rank_file(0), "rank-00000.pt"),
        (rank_file(42), "rank-00042.pt"),
    ],
)
def test_names(made: str, expected: str) -> None:
    """Names are zero-padded exactly as the supervisor and preflight expect."""
    assert made == expected


@pytest.mark.parametrize(
    "make",
    [
        lambda: committed_name(-1),
        lambda: committed_name(10**10),
        lambda: committed_name(True),
        lambda: temp_name(1, ""),
        lambda: temp_name(1, "a/b"),
        lambda: rank_file(-1),
        lambda: rank_file(100_000),
    ],
)
def test_bad_name_arguments_raise(make: Callable[[], str]) -> None:
    """Out-of-range steps/ranks and tags that cannot be part of a name are refused."""
    with pytest.raises(ValueError, match=r"step|tag|rank"):
        make()


@pytest.mark.parametrize(
    ("name", "committed_step", "temp_step_tag", "owned"),
    [
        ("step-0000000123", 123, None, True),
        ("step-123", None, None, False),
        ("step-00000001234", None, None, False),
        ("step-0000000123.bak", None, None, False),
        (".tmp-step-0000000123-a3", None, (123, "a3"), True),
        (".tmp-step-0000000123-rm-ab12", None, (123, "rm-ab12"), True),
        (".tmp-step-0000000123-", None, None, False),
        (".tmp-step-123-a3", None, None, False),
        (".rvsup", None, None, True),
        (".rvsup-protect", None, None, True),
        (".rvsup-protect.partial", None, None, True),
        (".rvsup-protected", None, None, False),
        ("notes.txt", None, None, False),
        ("tmp-step-0000000123-a3", None, None, False),
    ],
)
def test_regexes_and_ownership(
    name: str, committed_step: int | None, temp_step_tag: tuple[int, str] | None, owned: bool
) -> None:
    """The regexes recognise exactly the layout's names, and only those are rvsup entries."""
    c = layout.COMMITTED_RE.match(name)
    t = layout.TEMP_RE.match(name)
    assert (int(c.group(1)) if c else None) == committed_step
    assert ((int(t.group(1)), t.group(2)) if t else None) == temp_step_tag
    assert layout.is_rvsup_entry(name) is owned


def test_validate_good_checkpoint(tmp_path: Path) -> None:
    """A complete checkpoint validates, and its info adds up the listed sizes."""
    path = make_checkpoint(tmp_path, 7, world_size=3)
    info = layout.validate(path)
    assert info == layout.CheckpointInfo(7, path, 3, 107 + 10 + 11 + 12, 1.5)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / MANIFEST).unlink(), "missing MANIFEST.json"),
        (lambda p: (p / MANIFEST).write_text("{not json"), "not valid JSON"),
        (lambda p: (p / MANIFEST).write_bytes(b"\xff\xfe"), "not valid JSON"),
        (lambda p: (p / MANIFEST).write_text("[1, 2]"), "not a JSON object"),
        (lambda p: rewrite_manifest(p, format=3), "unknown format 3"),
        (lambda p: rewrite_manifest(p, files={"dcp/x": 1}), "bad file name 'dcp/x'"),
        (lambda p: rewrite_manifest(p, format=True), "unknown format True"),
        (lambda p: rewrite_manifest(p, step=4), "step 4 in MANIFEST.json does not match"),
        (lambda p: rewrite_manifest(p, step="3"), "does not match"),
        (lambda p: rewrite_manifest(p, world_size=0), "bad world_size 0"),
        (lambda p: rewrite_manifest(p, world_size=3), "fewer than world_size 3"),
        (lambda p: rewrite_manifest(p, created=None), "bad created time"),
        (lambda p: rewrite_manifest(p, files=[]), "no 'files' object"),
        (lambda p: rewrite_manifest(p, files={"../x": 1}), "bad file name"),
        (without_file(rank_file(1)), "fewer than world_size"),
        (
            lambda p: rewrite_manifest(p, files={SHARED: 103, "rank-00000.pt": 10, "a": 0}),
            "rank-00001",
        ),
        (
            lambda p: rewrite_manifest(p, files={"x": 0, "rank-00000.pt": 10, "rank-00001.pt": 11}),
            SHARED,
        ),
        (lambda p: (p / rank_file(1)).unlink(), "missing file rank-00001.pt"),
        (truncate, "rank-00001.pt is 5 bytes, MANIFEST.json says 11"),
        (lambda p: (p / SHARED).write_bytes(b"y" * 200), "shared.pt is 200 bytes"),
    ],
)
def test_validate_rejects_damage(
    tmp_path: Path, damage: Callable[[Path], object], reason: str
) -> None:
    """Each kind of damaged checkpoint is rejected with a reason naming the problem."""
    path = make_checkpoint(tmp_path, 3)
    damage(path)
    with pytest.raises(CorruptCheckpointError, match=reason.replace("(", r"\(")) as caught:
        layout.validate(path)
    assert str(caught.value) == caught.value.reason


def test_validate_good_format2_checkpoint(tmp_path: Path) -> None:
    """A format-2 checkpoint with a dcp/ directory validates; its info carries the objects and
    the checksums of the files in dcp/."""
    path = make_checkpoint_v2(tmp_path, 7)
    info = layout.validate(path)
    assert (info.step, info.world_size, info.format) == (7, 2, 2)
    assert info.nbytes == 107 + 10 + 11 + 50 + 70 + 71
    assert info.objects == (("Transformer", "dcp"), ("AdamW", "dcp"), ("LambdaLR", "shared"))
    assert info.checksums == (
        ("dcp/.metadata", 1050),
        ("dcp/__0_0.distcp", 1070),
        ("dcp/__1_0.distcp", 1071),
    )


def drop_checksum(name: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        manifest = json.loads((path / MANIFEST).read_text())
        del manifest["checksums"][name]
        (path / MANIFEST).write_text(json.dumps(manifest))

    return change


def only_shared_objects(path: Path) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    del manifest["files"][DCP_METADATA]
    del manifest["checksums"][DCP_METADATA]
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: rewrite_manifest(p, checksums=[]), "no 'checksums' object"),
        (drop_checksum("dcp/__1_0.distcp"), "no checksum for dcp/__1_0.distcp"),
        (lambda p: rewrite_manifest(p, checksums={"dcp/x": 1}), "bad checksum for 'dcp/x'"),
        (lambda p: rewrite_manifest(p, checksums={DCP_METADATA: -1}), "bad checksum"),
        (lambda p: rewrite_manifest(p, checksums={DCP_METADATA: 2**32}), "bad checksum"),
        (lambda p: rewrite_manifest(p, objects=None), "no 'objects' list"),
        (lambda p: rewrite_manifest(p, objects=[{"class": "A"}]), "bad object entry"),
        (lambda p: rewrite_manifest(p, objects=[{"class": 1, "state": "dcp"}]), "bad object"),
        (only_shared_objects, "does not list dcp/.metadata"),
        (lambda p: rewrite_manifest(p, files={"dcp/../x": 1}), "bad file name"),
        (lambda p: rewrite_manifest(p, files={"dcp/a/b": 1}), "bad file name"),
        (lambda p: rewrite_manifest(p, files={"dcp/": 1}), "bad file name"),
        (lambda p: (p / "dcp" / "__1_0.distcp").write_bytes(b"d"), "dcp/__1_0.distcp is 1"),
        (lambda p: (p / DCP_METADATA).unlink(), "missing file dcp/.metadata"),
    ],
)
def test_validate_rejects_damaged_format2(
    tmp_path: Path, damage: Callable[[Path], object], reason: str
) -> None:
    """Each kind of damaged format-2 checkpoint (checksums, objects, dcp/ files) is rejected
    with a reason naming the problem."""
    path = make_checkpoint_v2(tmp_path, 3)
    damage(path)
    with pytest.raises(CorruptCheckpointError, match=reason.replace("(", r"\(")):
        layout.validate(path)


@pytest.mark.parametrize("name", [".tmp-step-0000000003-a1", "checkpoint-3", "step-3"])
def test_validate_refuses_uncommitted_names(tmp_path: Path, name: str) -> None:
    """Only a directory with a committed name can validate, whatever it holds."""
    path = make_checkpoint(tmp_path, 3, name=name)
    with pytest.raises(CorruptCheckpointError, match="not a committed checkpoint name"):
        layout.validate(path)


def test_validate_refuses_a_file(tmp_path: Path) -> None:
    """A regular file with a committed name is not a checkpoint."""
    (tmp_path / committed_name(3)).write_text("")
    with pytest.raises(CorruptCheckpointError, match="not a directory"):
        layout.validate(tmp_path / committed_name(3))


def test_scan_orders_newest_first_and_reports_skipped(tmp_path: Path) -> None:
    """scan lists valid checkpoints newest first, reports bad committed ones, ignores the rest."""
    for step in (2, 10, 1):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 11)
    truncate(tmp_path / committed_name(11))
    make_checkpoint(tmp_path, 12, name=temp_name(12, "a1"))
    (tmp_path / MARKER).write_text("")
    (tmp_path / "notes.txt").write_text("mine")
    valid, skipped = layout.scan(tmp_path)
    assert [info.step for info in valid] == [10, 2, 1]
    assert [(p.name, "bytes" in why) for p, why in skipped] == [(committed_name(11), True)]
    latest = layout.latest(tmp_path)
    assert latest is not None
    assert latest.step == 10


@pytest.mark.parametrize("exists", [True, False])
def test_scan_of_empty_or_missing_directory(tmp_path: Path, exists: bool) -> None:
    """An empty or missing directory holds no checkpoint (a fresh start), and that is no error."""
    directory = tmp_path / "ckpt"
    if exists:
        directory.mkdir()
    assert layout.scan(directory) == ([], [])
    assert layout.latest(directory) is None


def populate(directory: Path) -> set[str]:
    """Valid 1, 2, 4, 5; invalid 3 (older than newest) and 6 (newer); temps; foreign names."""
    for step in (1, 2, 3, 4, 5, 6):
        make_checkpoint(directory, step)
    truncate(directory / committed_name(3))
    truncate(directory / committed_name(6))
    (directory / temp_name(7, "a1")).mkdir()
    (directory / temp_name(7, "a2")).mkdir()
    (directory / temp_name(8, "a2")).write_text("")
    (directory / MARKER).write_text("")
    (directory / "notes.txt").write_text("mine")
    (directory / "step-5").mkdir()
    (directory / "my-run").mkdir()
    return {MARKER, "notes.txt", "step-5", "my-run"}


@pytest.mark.parametrize(
    ("keep_last", "kept_steps"),
    [(0, [5]), (1, [5]), (2, [4, 5]), (3, [2, 4, 5]), (4, [1, 2, 4, 5]), (9, [1, 2, 4, 5])],
)
def test_prune(tmp_path: Path, keep_last: int, kept_steps: list[int]) -> None:
    """prune keeps the newest keep_last valid ones (never the newest valid), removes invalid
    older ones and other attempts' temps, keeps newer invalid ones and everything foreign."""
    foreign = populate(tmp_path)
    removed = layout.prune(tmp_path, keep_last, current_attempt_tag="a2")
    left = set(os.listdir(tmp_path))
    kept = {committed_name(s) for s in kept_steps} | {committed_name(6)}
    assert left == foreign | kept | {temp_name(7, "a2"), temp_name(8, "a2")}
    gone = {committed_name(s) for s in (1, 2, 3, 4, 5)} - kept | {temp_name(7, "a1")}
    assert {p.name for p in removed} == gone


@pytest.mark.parametrize(
    ("protect", "kept_steps"), [("5", [4, 5]), ("4", [2, 5]), ("3", [2, 5]), ("0", [5]), ("x", [5])]
)
def test_prune_keeps_the_newest_before_the_protected_step(
    tmp_path: Path, protect: str, kept_steps: list[int]
) -> None:
    """With a PROTECT step, pruning also keeps the newest valid checkpoint older than it (a
    rollback's target); none older, or an unreadable file, protects nothing."""
    foreign = populate(tmp_path) | {layout.PROTECT}
    (tmp_path / layout.PROTECT).write_text(protect)
    layout.prune(tmp_path, 1, current_attempt_tag="a2")
    kept = {committed_name(s) for s in kept_steps} | {committed_name(6)}
    assert set(os.listdir(tmp_path)) == foreign | kept | {temp_name(7, "a2"), temp_name(8, "a2")}


def test_protect_is_written_and_removed(tmp_path: Path) -> None:
    """write_protect replaces the step atomically; None removes the file."""
    assert layout.read_protect(tmp_path) is None
    layout.write_protect(tmp_path, 40)
    layout.write_protect(tmp_path, 41)
    assert layout.read_protect(tmp_path) == 41 and os.listdir(tmp_path) == [layout.PROTECT]
    layout.write_protect(tmp_path, None)
    layout.write_protect(tmp_path, None)
    assert os.listdir(tmp_path) == []


def test_prune_without_current_attempt_removes_every_temp(tmp_path: Path) -> None:
    """With no current attempt every temp entry goes, committed ones follow keep_last."""
    foreign = populate(tmp_path)
    layout.prune(tmp_path, 1)
    assert set(os.listdir(tmp_path)) == foreign | {committed_name(5), committed_name(6)}


def test_prune_keeps_invalid_ones_when_nothing_is_valid(tmp_path: Path) -> None:
    """Without any valid checkpoint there is no newest one: invalid ones are left for people."""
    make_checkpoint(tmp_path, 1)
    truncate(tmp_path / committed_name(1))
    assert layout.prune(tmp_path, 1) == []
    assert os.listdir(tmp_path) == [committed_name(1)]


def test_prune_of_missing_directory(tmp_path: Path) -> None:
    """Pruning a directory that does not exist removes nothing."""
    assert layout.prune(tmp_path / "nope", 1) == []


def test_half_removed_checkpoint_never_looks_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """discard renames before deleting: if deletion dies part-way no committed name is left,
    and a later prune cleans up the leftover."""
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2)

    def dies_half_way(path: Path) -> None:
        (Path(path) / SHARED).unlink()
        raise OSError("killed")

    with monkeypatch.context() as m:
        m.setattr("shutil.rmtree", dies_half_way)
        with pytest.raises(OSError, match="killed"):
            layout.discard(tmp_path / committed_name(1))
    names = os.listdir(tmp_path)
    assert committed_name(1) not in names
    [leftover] = [n for n in names if layout.TEMP_RE.match(n)]
    assert layout.scan(tmp_path) == ([layout.validate(tmp_path / committed_name(2))], [])
    assert layout.prune(tmp_path, 5, current_attempt_tag="a1") == [tmp_path / leftover]
    assert os.listdir(tmp_path) == [committed_name(2)]


def test_discard_from_a_step_keeps_the_ones_before(tmp_path: Path) -> None:
    """A rollback's discard: the valid checkpoints of the step and later go (their steps,
    newest first), the ones before stay and are listed, newest first; a damaged one is no
    valid checkpoint and is left alone."""
    for step in (5, 9, 14, 19):
        make_checkpoint(tmp_path, step)
    (tmp_path / committed_name(19) / SHARED).write_bytes(b"short")  # damaged: not valid
    gone, before = layout.discard_from(tmp_path, 9)
    assert gone == (14, 9)
    assert [info.step for info in before] == [5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [committed_name(5), committed_name(19)]
    assert layout.discard_from(tmp_path / "missing", 0) == ((), [])


def test_layout_does_not_import_torch() -> None:
    """The supervisor imports worker_sdk.contract.layout, so it must not pull in torch."""
    code = "import sys, worker_sdk.contract.layout; sys.exit('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0

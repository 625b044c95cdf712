"""The documentation's promises: generated pages match their sources, README's two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.config.load import parse_config
from tests import docgen

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", sorted(docgen.PAGES))
def test_generated_page_is_current(page: str) -> None:
    """A committed generated page is what the generator writes from today's sources."""
    committed = (ROOT / page).read_text(encoding="utf-8")
    assert committed == docgen.PAGES[page]() + "\n", (
        f"{page} is stale: run `{docgen.COMMAND}` and commit the result"
    )


def test_wrong_documented_default_is_refused() -> None:
    """A key whose documented default is not what the loader resolves stops the generator."""
    resolved = parse_config({"job": {"name": "NAME", "command": ["python"]}}, Path("/j/job.toml"))
    wrong = docgen.Key("term_timeout", 'default ``"6s"``, >= 0', "the teardown's deadline")
    with pytest.raises(ValueError, match=r"launch\.term_timeout"):
        docgen._check_default("launch", wrong, resolved)


def test_every_key_is_documented_once() -> None:
    """The reference has one row per key the loader accepts, in every section."""
    text = docgen.configuration()
    for section, keys in {
        "checkpoint": ("every_steps", "every", "keep_last", "async"),
        "heartbeat": ("interval", "hang_timeout", "hang_timeout_max", "native_stacks"),
    }.items():
        block = text.split(f"## `[{section}]`")[1].split("## ")[0]
        rows = re.findall(r"^\| `(\w+)` \|", block, flags=re.MULTILINE)
        assert set(keys) <= set(rows), section
        assert len(rows) == len(set(rows)), section


def test_readme_starts_with_the_two_commands() -> None:
    """README opens with the example job and the test command, and CI runs that test command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]]
    assert commands[:2] == ["bash examples/ddp_toy/run.sh", "bash tests/run.sh"]
    assert readme.index("```") < readme.index("\n## ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^[^#\n]*\bbash tests/run\.sh$", ci, flags=re.MULTILINE)

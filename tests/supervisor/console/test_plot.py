"""`rvsup history --plot`: the picture of a recorded multi-failure history, in SVG and PNG."""

from __future__ import annotations

import builtins
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.console import plot
from supervisor.record import history

HISTORY = Path(__file__).with_name("data") / "multi_failure.events.jsonl"
"""A real run: 2 ranks, 150 steps, a crash (raise) at step 38, a SIGKILL at step 84, a hang
(a deadlock) at step 120, then success; a checkpoint every 10 steps."""
NOW = datetime(2027, 1, 1, tzinfo=timezone.utc)


def _ids(svg: Path) -> dict[str, ET.Element]:
    root = ET.parse(svg).getroot()
    return {el.attrib["id"]: el for el in root.iter() if "id" in el.attrib}


def test_svg_has_every_failure_checkpoint_and_redone_span(tmp_path: Path) -> None:
    """One marker per failure (by attempt), one mark per committed checkpoint (tier storage),
    a shaded span per attempt whose steps were redone, and goodput in the title."""
    pytest.importorskip("matplotlib", reason="needs the extra rvsup[plot]")
    svg = tmp_path / "history.svg"
    plot.draw(history.read(HISTORY).entries, NOW, svg, job="demo")
    ids = _ids(svg)
    failures = sorted(i for i in ids if i.startswith("failure-"))
    assert failures == ["failure-1", "failure-2", "failure-3"]
    marks = {i for i in ids if i.startswith("checkpoint-")}
    assert marks == {f"checkpoint-storage-{step}" for step in range(9, 150, 10)}
    assert {"redone-1", "redone-2"} <= set(ids) and "redone-3" not in ids
    assert {"hang-3", "startup-1", "backoff-1"} <= set(ids)
    assert {"goodput", "badput-startup", "badput-hang_detection"} <= set(ids)
    title = "".join(ids["title"].itertext())
    assert "goodput 30.0%" in title and "3 failures" in title and "13 steps redone" in title


def test_png_is_written(tmp_path: Path) -> None:
    """The same history drawn as PNG: a PNG image of the figure's size."""
    pytest.importorskip("matplotlib", reason="needs the extra rvsup[plot]")
    from matplotlib import image

    png = tmp_path / "history.png"
    plot.draw(history.read(HISTORY).entries, NOW, png, job="demo")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.imread(png).shape[:2] == (715, 1210)


@pytest.mark.parametrize("name", ["history.pdf", "history.svgz", "history"])
def test_other_suffixes_are_refused(tmp_path: Path, name: str) -> None:
    """A file that does not end in .png or .svg is refused, naming the two, and not written."""
    with pytest.raises(plot.PlotError, match=r"must end in \.png or \.svg"):
        plot.draw(history.read(HISTORY).entries, NOW, tmp_path / name, job="demo")
    assert not (tmp_path / name).exists()


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without matplotlib the message says which extra to install."""
    real = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot.PlotError, match=r"rvsup\[plot\]"):
        plot.draw(history.read(HISTORY).entries, NOW, tmp_path / "h.png", job="demo")

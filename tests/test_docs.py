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


# A figure: a decimal number (a range's ends, a ratio's "0.15x", "0.44 s" alike); not a version.
_FIGURE = re.compile(r"(?<![\w.\-])(\d+\.\d+)(?![\d.])")
_NOT_A_FIGURE = re.compile(r"(Linux|Python|torch|torchrun|nvidia-resiliency-ext|torchft) $")
_FOOTNOTE = "¹²³⁴⁵⁶⁷⁸⁹"


def _runs() -> dict[str, str]:
    """docs/benchmarks.md by numbered run: each run's section (``## R17: ...``; ``## R9-R12: ...``
    for each of R9 to R12) with its row of the index table."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    runs: dict[str, str] = {}
    for head in re.finditer(r"^## R(\d+)(?:\N{EN DASH}R(\d+))?\b.*$", text, flags=re.MULTILINE):
        rest = text[head.end() :]
        after = re.search(r"^## ", rest, flags=re.MULTILINE)
        body = rest[: after.start()] if after else rest
        for n in range(int(head.group(1)), int(head.group(2) or head.group(1)) + 1):
            runs[f"R{n}"] = runs.get(f"R{n}", "") + body
    for row in re.finditer(r"^\| R(\d+) \|.*$", text, flags=re.MULTILINE):
        runs[f"R{row.group(1)}"] = runs.get(f"R{row.group(1)}", "") + row.group(0)
    return runs


def _quoted(text: str, runs: dict[str, str]) -> list[str]:
    """Each figure of ``text`` that a passage attributes to numbered runs but none of their
    records has (rounded as quoted). A passage is a paragraph or a list item; a table or a
    footnote right after a passage that names runs quotes those runs too."""
    wrong, context = [], set[str]()
    for passage in re.split(r"\n\s*\n|\n(?=[-*] )", text):
        named = set(re.findall(r"\bR(\d+)\b", passage))
        follows = passage.startswith("|") or passage[:1] in _FOOTNOTE
        cited = named | context if follows else named
        context = cited if named or follows else set()
        if not cited:
            continue
        records = [float(x) for n in cited for x in _FIGURE.findall(runs.get(f"R{n}", ""))]
        for m in _FIGURE.finditer(passage):
            if _NOT_A_FIGURE.search(passage[: m.start()]) or passage[m.end() :].startswith(" GiB"):
                continue
            places = len(m.group(1).split(".")[1])
            if not any(round(r, places) == float(m.group(1)) for r in records):
                wrong.append(f"{m.group(1)} (R{', R'.join(sorted(cited))}): {passage[:80]!r}")
    return wrong


_QUOTING = sorted(
    f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"
)


@pytest.mark.parametrize("page", ["README.md", *_QUOTING])
def test_quoted_figures_are_in_the_runs_they_name(page: str) -> None:
    """A figure quoted beside a numbered run (R17) is in that run's record in docs/benchmarks.md
    (rounded as quoted): a quote that drifts from its run, or names the wrong one, fails."""
    assert _quoted((ROOT / page).read_text(encoding="utf-8"), _runs()) == []


def test_a_drifted_quote_is_found() -> None:
    """The check above finds a figure that is not its run's, in a paragraph, in a table that
    follows one, and in its footnote; a rounded one passes."""
    runs = {"R1": "MTTR 0.44 s (0.41\N{EN DASH}1.43); 0.00264 %", "R2": "goodput 0.523"}
    assert _quoted("In R1 the MTTR was 0.44 s, 0.003 %.", runs) == []
    assert _quoted("In R1 the MTTR was 0.45 s.", runs) != []
    assert _quoted("R2 measured 0.44 s.", runs) != []
    assert _quoted("Figures of R1:\n\n| MTTR | 0.47 s |", runs) != []
    assert _quoted("Figures of R1:\n\n¹ With R2: 0.523, and 0.41.", runs) == []
    assert _quoted("No run named: 9.99 s.", runs) == []

"""Writes the generated pages of ``docs/``: the job.toml reference and the history's events.

Run ``python -m tests.docgen`` from the repository's root after changing
:mod:`supervisor.config.model` or :mod:`supervisor.record.schema`; ``tests/test_docs.py``
fails while a committed page differs from what this writes. ``--check`` only compares.

The configuration reference reads each section's dataclass: its keys and types from the fields,
the default and description of every key from the section's docstring (one
``- ``key`` (default …): description`` item per key). Every documented default is checked
against the loader: a file that sets a key to its documented default must resolve exactly as a
file that leaves it out. The events page reads :mod:`supervisor.record.schema`: each event's
docstring, its fields' types, and each field's docstring (the string after it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, Union, get_args, get_origin, get_type_hints

from supervisor.config.load import parse_config
from supervisor.config.model import JobConfig, toml_key
from supervisor.config.render import render_config
from supervisor.record import schema, typed_json
from supervisor.rules import observation
from supervisor.service.metrics_catalog import LABEL_VALUES, METRICS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT: Final = Path(__file__).resolve().parent.parent
COMMAND: Final = "python -m tests.docgen"
_NAME: Final = "NAME"
_MINIMAL: Final[Mapping[str, Any]] = {"job": {"name": _NAME, "command": ["python", "train.py"]}}
_JOB_TOML: Final = Path("/jobs/job.toml")


def _md(text: str) -> str:
    """Docstring text as one Markdown line: whitespace folded, RST literals and references
    (``:mod:`name```) as code spans."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"``\1``", text)
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _header(title: str, source: str) -> list[str]:
    return [
        f"# {title}",
        "",
        f"<!-- Generated from {source} by `{COMMAND}`; do not edit by hand. -->",
        "",
    ]


# ------------------------------------------------------------------------------ job.toml


@dataclasses.dataclass(frozen=True)
class Key:
    """One documented key: its TOML name, the text in brackets after it, its description."""

    name: str
    note: str
    text: str


def _split_item(item: str) -> Key:
    """``- ``key`` (note): text`` -> Key; the note may hold brackets of its own."""
    name, _, rest = item.removeprefix("- ``").partition("``")
    rest = rest.strip()
    if not rest.startswith("("):
        raise ValueError(f"{name}: expected '(default ...)' or '(required)' after the key")
    depth = 0
    for index, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            note, text = rest[1:index], rest[index + 1 :].removeprefix(":").strip()
            return Key(name, " ".join(note.split()), text)
    raise ValueError(f"{name}: unbalanced brackets")


def section_keys(cls: type) -> tuple[str, list[Key]]:
    """A section's docstring: its first paragraph, and its items, one per key."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    intro, _, body = doc.partition("\n\n")
    items: list[str] = []
    for line in body.splitlines():
        if line.startswith("- ``"):
            items.append(line)
        elif line.strip() and items:
            items[-1] += " " + line.strip()
    return intro, [_split_item(item) for item in items]


def _none_word(section: str, name: str, resolved: JobConfig) -> str:
    """What job.toml writes for a field's None (``"auto"``, ``"off"``), as the loader renders it."""
    values = dataclasses.replace(getattr(resolved, section), **{name: None})
    text = render_config(dataclasses.replace(resolved, **{section: values}))
    return str(tomllib.loads(text)[section][toml_key(name)])


def _type(hint: Any, name: str, none: Callable[[], str]) -> str:
    """A field's type as job.toml spells it."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        (inner,) = (arg for arg in args if arg is not type(None))
        return f'{_type(inner, name, none)} or `"{none()}"`'
    if origin is Literal:
        return "one of " + ", ".join(f'`"{arg}"`' for arg in args)
    if origin is tuple:
        return "array of strings"
    if hint is float:
        return "duration" if name.endswith("_s") else "number"
    simple = {bool: "boolean", int: "integer", str: "string", Path: "path"}
    return simple.get(hint, "table of strings")


def _check_default(section: str, key: Key, resolved: JobConfig) -> None:
    """The documented default of ``key`` resolves as leaving the key out does."""
    if not key.note.startswith("default "):
        if key.note != "required":
            raise ValueError(f"{section}.{key.name}: the note must start with 'default '")
        return
    shown = key.note.removeprefix("default ").replace("``", "")
    value_text, depth = "", 0
    for char in shown:
        if depth == 0 and char in ",:":
            break
        depth += {"[": 1, "]": -1, "{": 1, "}": -1}.get(char, 0)
        value_text += char
    value_text = value_text.replace("<name>", _NAME)
    data = {**_MINIMAL, section: {**_MINIMAL.get(section, {}), key.name: 0}}
    data[section][key.name] = tomllib.loads(f"v = {value_text}")["v"]
    if parse_config(data, _JOB_TOML) != resolved:
        raise ValueError(f"{section}.{key.name}: the documented default {value_text} is not it")


def _section_rows(section: str, cls: type, resolved: JobConfig) -> Iterator[str]:
    intro, keys = section_keys(cls)
    hints = get_type_hints(cls)
    by_key = {toml_key(f.name): f.name for f in dataclasses.fields(cls)}
    documented = [key.name for key in keys]
    if documented != list(by_key):
        raise ValueError(f"[{section}] documents {documented}, its fields are {list(by_key)}")
    yield f"## `[{section}]`"
    yield ""
    summary = _md(intro.partition(":")[2] if intro.startswith("``[") else intro)
    yield summary[:1].upper() + summary[1:]
    yield ""
    yield "| key | type | default, limits | what |"
    yield "|---|---|---|---|"
    for key in keys:
        _check_default(section, key, resolved)
        name = by_key[key.name]
        kind = _type(hints[name], name, functools.partial(_none_word, section, name, resolved))
        note = _md(key.note.removeprefix("default "))
        yield f"| `{key.name}` | {kind} | {note} | {_md(key.text)} |"
    yield ""


def configuration() -> str:
    """docs/configuration.md: every section and key of job.toml."""
    resolved = parse_config(_MINIMAL, _JOB_TOML)
    hints = get_type_hints(JobConfig)
    lines = _header("job.toml reference", "`supervisor/config/model.py`")
    lines += [
        "Every section and key rvsup reads; anything else is refused with the list of valid keys.",
        "Only `[job]` is required, and in it only `name` and `command`. Durations are seconds or",
        '`"500ms"`, `"90s"`, `"5m"`, `"1h30m"`, `"2d"`. Relative paths are relative to job.toml\'s',
        "folder (`workdir`) or to `workdir` (the others); `~` is expanded. `rvsup validate",
        "job.toml` prints the resolved file with every default filled in.",
        "",
    ]
    for item in dataclasses.fields(JobConfig)[1:]:
        lines += _section_rows(item.name, hints[item.name], resolved)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ events


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written after a class's attributes (fields, enum members), by name."""
    (node,) = (
        n
        for n in ast.parse(inspect.getsource(sys.modules[cls.__module__])).body
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    docs: dict[str, str] = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        target: ast.expr | None = None
        if isinstance(statement, ast.AnnAssign):
            target = statement.target
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        text = following.value if isinstance(following, ast.Expr) else None
        if isinstance(target, ast.Name) and isinstance(text, ast.Constant):
            docs[target.id] = str(text.value)
    return docs


def _event_section(name: str, cls: type[schema.Event]) -> Iterator[str]:
    docs = attribute_docs(cls)
    yield f"## `{name}`"
    yield ""
    yield f"Level `{cls.LEVEL}`. " + "\n\n".join(
        _md(p) for p in inspect.cleandoc(cls.__doc__ or "").split("\n\n")
    )
    yield ""
    yield "| field | type | what |"
    yield "|---|---|---|"
    for spec in typed_json.specs(cls):
        yield f"| `{spec.name}` | {spec.json_type} | {_md(docs.get(spec.name, ''))} |"
    yield ""


def events() -> str:
    """docs/events.md: every event of events.jsonl, its fields and their types."""
    lines = _header("The history's events", "`supervisor/record/schema/`")
    lines += [
        "`<run_dir>/events.jsonl` holds one JSON object per line, appended and fsynced, kept",
        "across requeues and restarts of rvsup; the events are a public contract. Every line has",
        "`timestamp` (ISO-8601 UTC), `event`, `level`, `job` and `attempt`, then the event's",
        "fields below, in this order. A reader takes any line any version wrote: a missing or",
        "malformed field is empty, and an event it does not know is skipped.",
        "",
        schema.describe(),
        "",
        "`failure_detected`'s `kind`: "
        + ", ".join(f"`{kind}`" for kind in observation.FailureKind)
        + "; the last three are the training itself going wrong (`anomaly_detected` comes first).",
        "",
        "`stop_requested`'s and `job_stopped`'s `reason`:",
        "",
    ]
    reasons = attribute_docs(observation.StopReason)
    lines += [f"- `{r}`: {_md(reasons[r.name])}" for r in observation.StopReason]
    lines.append("")
    for name, cls in schema.EVENTS.items():
        lines += _event_section(name, cls)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ metrics

_METRICS_INTRO: Final = """\
With a `[metrics]` section in job.toml (docs/configuration.md), the daemon exports the job's
metrics for Prometheus: `listen = "HOST:PORT"` serves them at `http://HOST:PORT/metrics`, and/or
`textfile = "PATH.prom"` writes them to a file, replaced atomically every `interval`, for
node_exporter's textfile collector (`--collector.textfile.directory`). Both need the optional
extra: `pip install 'rvsup[metrics]'` (prometheus-client); without it, a `[metrics]` section that
asks for either is refused when job.toml is loaded. A port already in use refuses `rvsup start`
(exit 2) before anything is launched.

```toml
[metrics]
listen = "127.0.0.1:9400"
textfile = "/var/lib/node_exporter/textfile/train.prom"
interval = "5s"
```

```yaml
# prometheus.yml, on the same node (one on another host needs listen = "node17:9400")
scrape_configs:
  - job_name: rvsup
    static_configs: [{targets: ["127.0.0.1:9400"]}]
```

The endpoint bounds what any client can take: 8 connections at once (one more is closed
unanswered), 5 s and 8 KiB for a request's head, 5 s for each read and for the answer. It
serves nothing but the metrics, to whoever can reach it: `127.0.0.1` keeps it off the network;
a Prometheus on another host needs the node's address (`listen = "node17:9400"`), which every
host that reaches the node can then scrape.

Updating a metric never blocks the daemon: counters move as each event is logged, gauges are
set every `interval` from what the daemon already holds, the file is written in a worker
thread, and the endpoint answers in threads of its own (`supervisor/service/metrics_http.py`).
The counters count the whole history of the job (they start from `events.jsonl` when the
daemon starts), so they match `rvsup history`; a new daemon (a restart of rvsup, a requeued
allocation) starts them again from the history, which Prometheus's `rate()` and `increase()`
read as a reset.

## Goodput

The goodput figures are the ones `rvsup history` prints (`supervisor/record/goodput.py`): the
wall time, from the first attempt's launch to the last one's end (now while it runs), is split
into goodput, the time spent on training steps that were kept, and badput by source, following
Google's ml-goodput-measurement:

- `startup`: launch to the ranks' `checkpoint_loaded`: interpreters, imports, process group
  and the checkpoint's restore (the history does not time the load apart); an attempt that
  never finished a step is all start-up.
- `checkpoint_save`: the time the training was blocked by saves (`blocked_s`).
- `wasted_progress`: the steps a later attempt ran again x the attempt's mean step time.
- `hang_detection`: a hang, from the last progress to its detection, then to its line
  (the stacks and flight recorders are collected in between).
- `backoff`: the restart delay.
- `recovery`: the rest of the time from a failure's first sign to the next launch: the
  classification, the teardown, health checks, the wait for a requeued allocation.

An attempt's mean step time is its time after start-up, less its save and hang time, over the
steps it finished; goodput plus the six sources is the wall time exactly. `rvsup history
--plot` draws the same figures ([history-plot.md](history-plot.md)). They are gauges, not
counters: they are folded again from the history every `interval`, and a failure moves time
that counted as goodput to wasted progress (the steps since the last checkpoint are redone).
Each counter also has the `_created` sample prometheus-client adds.
"""


def metrics() -> str:
    """docs/metrics.md: every metric of ``[metrics]``."""
    lines = _header("Metrics for Prometheus", "`supervisor/service/metrics_catalog.py`")
    lines.append(_METRICS_INTRO)
    lines += ["## Every metric", ""]
    lines += ["| metric | type | labels | what |", "|---|---|---|---|"]
    for name, (kind, text, labels) in METRICS.items():
        shown = ", ".join(f"`{label}`" for label in labels) or "-"
        lines.append(f"| `{name}` | {kind} | {shown} | {_md(text)} |")
    lines += ["", "Labels:", ""]
    lines += [f"- `{label}`: {values}" for label, values in LABEL_VALUES.items()]
    lines.append("")
    return "\n".join(lines)


PAGES: Final[Mapping[str, Callable[[], str]]] = {
    "docs/configuration.md": configuration,
    "docs/events.md": events,
    "docs/metrics.md": metrics,
}
"""Each generated page, by its path from the repository's root, and what writes it."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    check = parser.parse_args(argv).check
    stale = []
    for path, render in PAGES.items():
        text, target = render() + "\n", ROOT / path
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path}: {'stale' if check else 'written'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())

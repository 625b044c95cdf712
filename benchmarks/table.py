"""Cells (median, min-max, n), ratio rows, targets and the printed comparison tables."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

DASH = "\u2013"  # en dash of 'min-max' ranges


@dataclass
class Cell:
    """The measurements of one tool in one row; ``note`` explains missing or censored values."""

    values: list[float] = field(default_factory=list)
    unit: str = ""
    note: str = ""
    digits: int = 2

    def add(self, value: float | None) -> None:
        if value is not None:
            self.values.append(value)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def render(self) -> str:
        if not self.values:
            return self.note or "-"
        d = self.digits
        lo, hi, med = min(self.values), max(self.values), statistics.median(self.values)
        spread = "" if len(self.values) == 1 else f" ({lo:.{d}f}{DASH}{hi:.{d}f})"
        text = f"{med:.{d}f}{self.unit}{spread}, n={len(self.values)}"
        return f"{text}; {self.note}" if self.note else text

    def to_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": min(self.values) if self.values else None,
            "max": max(self.values) if self.values else None,
            "n": len(self.values),
            "values": [round(v, 6) for v in self.values],
            "unit": self.unit.strip(),
            "note": self.note,
        }


def ratio(a: Cell | None, b: Cell | None) -> float | None:
    """median(a) / median(b), or None when either is missing or b is zero."""
    if a is None or b is None or a.median is None or b.median is None or b.median == 0:
        return None
    return a.median / b.median


@dataclass(frozen=True)
class Target:
    """A goal from the README, with what was measured and whether it was met (None: unknown)."""

    goal: str
    measured: str
    hit: bool | None

    def render(self) -> str:
        mark = {True: "HIT ", False: "MISS", None: "n/a "}[self.hit]
        return f"  [{mark}] {self.goal}: {self.measured}"


@dataclass
class Table:
    """One figure: one column per tool, rows of cells, ratio rows, targets and notes."""

    key: str
    title: str
    columns: list[str]
    rows: list[tuple[str, dict[str, Cell | str]]] = field(default_factory=list)
    ratios: list[tuple[str, float | None]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def row(self, label: str, cells: dict[str, Cell | str]) -> None:
        self.rows.append((label, cells))

    def add_ratio(self, label: str, a: Cell | None, b: Cell | None) -> None:
        self.ratios.append((label, ratio(a, b)))

    def cell(self, label: str, column: str) -> Cell | None:
        for name, cells in self.rows:
            value = cells.get(column)
            if name == label and isinstance(value, Cell):
                return value
        return None

    def render(self) -> str:
        header = ["", *self.columns]
        body = [[label, *(_text(cells.get(c)) for c in self.columns)] for label, cells in self.rows]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        lines = [
            f"== {self.title}",
            _line(header, widths),
            _line(["-" * w for w in widths], widths),
        ]
        lines += [_line(r, widths) for r in body]
        for label, value in self.ratios:
            lines.append(f"  {label}: {'n/a' if value is None else f'{value:.2f}x'}")
        lines += [t.render() for t in self.targets]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  (figure wall time {self.wall_s:.0f} s)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": {
                label: {c: (v.to_json() if isinstance(v, Cell) else v) for c, v in cells.items()}
                for label, cells in self.rows
            },
            "ratios": dict(self.ratios),
            "targets": [
                {"goal": t.goal, "measured": t.measured, "hit": t.hit} for t in self.targets
            ],
            "notes": self.notes,
            "wall_s": round(self.wall_s, 1),
        }


def _text(value: Cell | str | None) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else value.render()


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"

"""``rvsup status``: the daemon's answer as text, once or refreshed in place (``--watch``).

:func:`render` is pure: the daemon's status answer, the history's rows and the progress seen
between refreshes in, lines out. :func:`watch` asks the daemon every few seconds and shows the
lines with :mod:`curses` on a terminal (redrawn in place, ``q`` quits), or prints them as plain
blocks, one per refresh, when standard output is not a terminal; both end when the daemon does.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from supervisor.record.history import AttemptRow

__all__ = ["Progress", "render", "watch"]

_RATE_WINDOW_S = 60.0  # steps per second over this much of the recent past


@dataclass(slots=True)
class Progress:
    """The slowest rank's last step seen at each refresh, for steps per second."""

    samples: collections.deque[tuple[float, int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=512)
    )

    def add(self, now: float, attempt: int, step: int) -> None:
        while self.samples and (
            self.samples[0][1] != attempt or now - self.samples[0][0] > _RATE_WINDOW_S
        ):
            self.samples.popleft()
        self.samples.append((now, attempt, step))

    def rate(self) -> float | None:
        """Steps per second over the window, None until two refreshes of one attempt."""
        if len(self.samples) < 2:
            return None
        (t0, _, s0), (t1, _, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def slowest_step(answer: dict[str, Any]) -> int | None:
    steps = [int(r["last_step"]) for r in answer.get("ranks", [])]
    return min(steps) if steps else None


def render(answer: dict[str, Any], rows: Sequence[AttemptRow], rate: float | None) -> list[str]:
    """The status as lines: the job, the ranks' table, checkpoints, the last failure, the rest."""
    left = int(answer["max_restarts"]) - int(answer["restarts_used"])
    head = (
        f"{answer['job']}: {answer['state']}, attempt {answer['attempt']}, "
        f"restarts {answer['restarts_used']}/{answer['max_restarts']} ({left} left), "
        f"hang timeout {_seconds(answer['hang_timeout_s'])}, daemon pid {answer['pid']}"
    )
    newest = f"newest checkpoint: storage step {_or_dash(answer['newest_checkpoint_step'])}"
    lines = [head, _progress_line(answer, rate), newest]
    failures = [r for r in rows if r.failure_kind is not None and r.detail]
    if failures:
        last = failures[-1]
        lines.append(f"last failure: attempt {last.attempt}, {last.failure_kind}: {last.detail}")
    lines.append(
        f"{'rank':>4}  {'host':<16} {'pid':>8}  {'last step':>9}  {'heartbeat age':>13}  phase"
    )
    lines += [
        f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['last_step']:>9}  "
        f"{r['heartbeat_age_s']:>12.1f}s  {r['phase'] or ''}"
        for r in answer["ranks"]
    ]
    lines += _busy_lines(answer)
    lines += _straggler_lines(answer)
    lines += _agent_lines(answer)
    lines += [
        f"checkpoint of step {failed['step']} failed on rank {failed['rank']} "
        f"(not committed, the previous one is kept): {failed['reason']}"
        for failed in answer.get("checkpoint_failures", [])
    ]
    lines += excluded_lines(answer.get("excluded_nodes") or {})
    msgs = answer["messages"]
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(msgs["dropped"].items())) or "none"
    lines.append(f"messages accepted: {msgs['accepted']}; dropped: {dropped}")
    return lines


def excluded_lines(excluded: Mapping[str, str]) -> list[str]:
    """One line per excluded node and why (``rvsup status`` and ``rvsup history``)."""
    return [f"excluded node {node}: {why}" for node, why in excluded.items()]


def _busy_lines(answer: dict[str, Any]) -> list[str]:
    """The silence judged busy now (a slow phase), and when it becomes a hang."""
    b = answer.get("busy")
    if not b:
        return []
    silent, hang = f"{b['silent_s']:.0f}s", f"{b['hang_at_s']:.0f}s"
    return [f"busy, no step for {silent}: {b['detail']}; a hang at {hang} ({b['bound']})"]


def _straggler_lines(answer: dict[str, Any]) -> list[str]:
    """The straggler named now, and the nodes the next restart leaves out for stragglers."""
    lines = []
    s = answer.get("straggler")
    if s:
        where = f" on {s['node']}" if s.get("node") else ""
        lines.append(
            f"straggler: rank {s['rank']}{where}, {s['slower']:.1f}x slower than the others: "
            f"they wait {_ms(s['lost_per_step_s'])} for it every {_ms(s['step_s'])} step "
            f"(named {s['since_s']:.0f}s ago)"
        )
    lines += [
        f"excluded at the next restart: {node} ({why})"
        for node, why in sorted((answer.get("exclude_at_restart") or {}).items())
    ]
    return lines


def _agent_lines(answer: dict[str, Any]) -> list[str]:
    """The node agents of a multi-node attempt: how many, their oldest beat, the least memory
    available, and one line per node whose processes the OOM killer killed."""
    a = answer.get("agents")
    if not a:
        return []
    least = a.get("least_memory")
    memory = f"; least memory available: {least[0]}, {least[1] / 2**30:.1f} GiB" if least else ""
    lines = [f"node agents: {a['count']}, oldest beat {a['oldest_beat_s']:.1f}s ago{memory}"]
    for node, (kills, why) in sorted((a.get("oom_kills") or {}).items()):
        counted = f" (the host's count: {why})" if why else ""
        lines.append(f"OOM kills on {node} this attempt: {kills}{counted}")
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.0095 else f"{seconds * 1000:.1f} ms"


def _progress_line(answer: dict[str, Any], rate: float | None) -> str:
    step = slowest_step(answer)
    totals = [r.get("total_steps") for r in answer["ranks"] if r.get("total_steps")]
    total = int(max(totals)) if totals else None
    text = f"step {_or_dash(step)}" + (f" of {total}" if total else "")
    text += f", {rate:.2f} steps/s" if rate is not None else ", - steps/s"
    if total is None:
        return text + " (the time left needs resume(total_steps=...))"
    if rate is None or rate <= 0 or step is None:
        return text + ", time left: -"
    left_s = max(0, total - 1 - step) / rate
    return text + f", time left ~{datetime.timedelta(seconds=round(left_s))}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


Ask = Callable[[], "dict[str, Any] | None"]
"""The daemon's status answer, or None once it is not running."""
Rows = Callable[[], Sequence[AttemptRow]]


def watch(ask: Ask, rows: Rows, out: TextIO, *, interval_s: float, terminal: bool) -> None:
    """Refresh every ``interval_s`` until the daemon ends (or ``q``, Ctrl-C on a terminal)."""
    if terminal:
        import curses  # the standard library's terminal handling; only a terminal needs it

        with contextlib.suppress(KeyboardInterrupt):
            curses.wrapper(_watch_screen, ask, rows, interval_s)
        return
    progress = Progress()
    while (answer := ask()) is not None:
        lines = _sample(answer, rows(), progress)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"--- {stamp} UTC\n" + "\n".join(lines) + "\n")
        out.flush()
        time.sleep(interval_s)


def _sample(answer: dict[str, Any], rows: Sequence[AttemptRow], progress: Progress) -> list[str]:
    step = slowest_step(answer)
    if step is not None:
        progress.add(time.monotonic(), int(answer["attempt"]), step)
    return render(answer, rows, progress.rate())


def _watch_screen(screen: Any, ask: Ask, rows: Rows, interval_s: float) -> None:
    import curses

    with contextlib.suppress(curses.error):  # a terminal without an invisible cursor
        curses.curs_set(0)
    screen.timeout(int(interval_s * 1000))  # getch() waits this long: the refresh period
    progress = Progress()
    while (answer := ask()) is not None:
        lines = _sample(answer, rows(), progress)
        height, width = screen.getmaxyx()
        screen.erase()
        header = f"every {interval_s:g}s, q quits"
        for y, line in enumerate([header, "", *lines][: height - 1]):
            screen.addnstr(y, 0, line, width - 1)
        screen.refresh()
        if screen.getch() in (ord("q"), ord("Q")):
            return

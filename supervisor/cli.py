"""``rvsup start|validate|status|stop|history|logs JOB.toml``, ``rvsup version``,
``rvsup completion SHELL``.

Exit codes: 0 success; 2 bad configuration or usage; 3 gave up; 75 (EX_TEMPFAIL) stopped on request,
preemption or time limit with the job resumable; 1 anything else (``status``/``stop`` without a
running daemon); 141 (128 + SIGPIPE) when the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from supervisor.config.load import load_config
from supervisor.config.model import ConfigError, JobConfig
from supervisor.config.preflight import preflight
from supervisor.config.render import render_config
from supervisor.config.torchrun import resolve_torchrun
from supervisor.console import logs, status_view
from supervisor.console.completion import completion_script
from supervisor.console.version import version_text
from supervisor.record import goodput, history, rundir, summary
from supervisor.record.entries import Entry
from supervisor.record.schema import JobStopped
from supervisor.rules.budget import budget_of
from supervisor.rules.states import ExitCode
from supervisor.service import control, heap, stop_signals

__all__ = [
    "build_parser",
    "cmd_history",
    "cmd_logs",
    "cmd_start",
    "cmd_status",
    "cmd_stop",
    "cmd_validate",
    "main",
]


def _load(path: str) -> JobConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"rvsup: invalid job file {path}:", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue.key or '(file)'}: {issue.message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE) from None


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    sys.stdout.write(render_config(cfg))
    sys.stdout.write(_torchrun_note(cfg))
    from supervisor.process.cgroup import mechanism_here  # tries a cgroup: only here

    sys.stdout.write(f"# teardown here: {mechanism_here()}\n")
    return ExitCode.OK


def _torchrun_note(cfg: JobConfig) -> str:
    """A TOML comment: the torchrun this machine would run (``rvsup start`` checks it)."""
    found = resolve_torchrun(cfg)
    if found is None:
        return "\n# launch.torchrun: none found here (rvsup start would refuse)\n"
    return f"\n# launch.torchrun here: {found.describe()}\n"


def cmd_start(args: argparse.Namespace) -> int:
    stops = stop_signals.installed()  # already, by supervisor.entry (unless main() is called)
    try:
        cfg = _load(args.job)
        issues = preflight(cfg)
        if issues:
            for issue in issues:
                print(f"rvsup: {issue.key}: {issue.message}", file=sys.stderr)
            return ExitCode.USAGE
        from supervisor.config.metrics import MetricsStartError
        from supervisor.daemon import AlreadyRunningError, run_daemon

        heap.settle()  # everything the daemon runs is imported by now
        try:
            console = None if args.quiet else sys.stderr
            return asyncio.run(run_daemon(cfg, console=console, stops=stops))
        except (AlreadyRunningError, MetricsStartError) as exc:
            print(f"rvsup: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    finally:
        stops.ignore()  # the exit status is final: a late stop cannot change it


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    try:
        answer = control.request(cfg.job.run_dir, "status")
    except control.NotRunningError as exc:
        rows = _history_rows(cfg)
        last = rows[-1].outcome if rows else "never started"
        if args.json:
            print(json.dumps({"ok": False, "state": "not running", "last_outcome": last}))
        else:
            print(f"{cfg.job.name}: not running ({exc}); last attempt: {last}")
        return ExitCode.ERROR
    if args.watch is not None:
        if args.watch <= 0:
            print("rvsup: --watch needs a number of seconds above 0", file=sys.stderr)
            return ExitCode.USAGE
        status_view.watch(
            lambda: _ask_status(cfg),
            lambda: _history_rows(cfg),
            sys.stdout,
            interval_s=args.watch,
            terminal=sys.stdout.isatty(),
        )
        rows = _history_rows(cfg)
        print(f"{cfg.job.name}: not running; last attempt: {rows[-1].outcome if rows else '-'}")
        return ExitCode.OK
    if args.json:
        print(json.dumps(answer, indent=2))
        return ExitCode.OK
    print("\n".join(status_view.render(answer, _history_rows(cfg), rate=None)))
    return ExitCode.OK


def _ask_status(cfg: JobConfig) -> dict[str, object] | None:
    try:
        return control.request(cfg.job.run_dir, "status")
    except (control.NotRunningError, OSError, ValueError):
        return None


def cmd_stop(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    try:
        info = json.loads((cfg.job.run_dir / rundir.DAEMON_FILE).read_text())
    except PermissionError:
        raise  # another user's job (said by _dispatch)
    except (OSError, ValueError):
        print(f"rvsup: no rvsup daemon is running for {cfg.job.run_dir}", file=sys.stderr)
        return ExitCode.ERROR
    try:
        answer = control.request(cfg.job.run_dir, "stop")
    except (control.NotRunningError, OSError, ValueError) as exc:
        print(f"rvsup: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if not answer.get("ok"):
        print(f"rvsup: {answer.get('error')}", file=sys.stderr)
        return ExitCode.ERROR
    print(f"{cfg.job.name}: stop requested (checkpoint at a common step, then exit)")
    if args.no_wait:
        return ExitCode.OK
    deadline = time.monotonic() + cfg.launch.stop_timeout_s + cfg.launch.term_timeout_s + 30
    pid = int(info["pid"])
    while _alive(pid):
        if time.monotonic() > deadline:
            print(f"rvsup: daemon {pid} is still running", file=sys.stderr)
            return ExitCode.ERROR
        time.sleep(0.1)
    past = history.read(cfg.job.run_dir / rundir.EVENTS_FILE)
    stopped = [e for e in past.events if isinstance(e, JobStopped)]
    if stopped:
        last = stopped[-1]
        print(f"{cfg.job.name}: stopped; checkpoint step {last.step} {last.note}")
    return ExitCode.OK


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _history_rows(cfg: JobConfig) -> list[history.AttemptRow]:
    return history.attempt_rows(history.read(cfg.job.run_dir / rundir.EVENTS_FILE).entries)


def _plot(target: Path, entries: Sequence[Entry], now: datetime.datetime, job: str) -> int:
    """``rvsup history --plot FILE``: the picture of the history, or why not (exit 2)."""
    from supervisor.console import plot

    try:
        plot.draw(entries, now, target, job=job)
    except plot.PlotError as exc:
        print(f"rvsup: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(f"rvsup: drew the history of {job} into {target}")
    return ExitCode.OK


def cmd_history(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    path = cfg.job.run_dir / rundir.EVENTS_FILE
    past = history.read(path)
    rows = history.attempt_rows(past.entries)
    now = datetime.datetime.now(datetime.timezone.utc)
    total = summary.summarize(rows, now)
    good = goodput.goodput_of(past.entries, now)
    excluded = dict(budget_of(past.events).excluded)
    if args.plot is not None:
        return _plot(args.plot, past.entries, now, cfg.job.name)
    if args.json:
        out = {
            "attempts": history.rows_to_json(rows),
            "summary": summary.summary_to_json(total),
            "goodput": goodput.goodput_to_json(good),
            "excluded_nodes": excluded,
        }
        print(json.dumps(out, indent=2))
    elif not rows:
        print(f"{cfg.job.name}: no attempts recorded in {path}")
        for line in status_view.excluded_lines(excluded):
            print(line)
    else:
        print(history.render_table(rows))
        print(summary.render_summary(total))
        print(goodput.render_goodput(good))
        for line in status_view.excluded_lines(excluded):
            print(line)
    if past.skipped:
        print(f"rvsup: skipped {past.skipped} unreadable line(s) of {path}", file=sys.stderr)
    if past.unknown:
        print(
            f"rvsup: skipped {past.unknown} line(s) of events this version does not know",
            file=sys.stderr,
        )
    return ExitCode.OK


def cmd_logs(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    run_dir = cfg.job.run_dir
    try:
        if args.follow:
            logs.follow(
                run_dir,
                sys.stdout,
                attempt=args.attempt,
                rank=args.rank,
                running=lambda: _daemon_running(run_dir),
            )
        else:
            logs.show(run_dir, sys.stdout, attempt=args.attempt, rank=args.rank)
    except logs.LogsError as exc:
        print(f"rvsup: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.OK
    return ExitCode.OK


def _daemon_running(run_dir: Path) -> bool:
    try:
        info = json.loads((run_dir / rundir.DAEMON_FILE).read_text())
        return _alive(int(info["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cmd_version(_: argparse.Namespace) -> int:
    sys.stdout.write(version_text())
    return ExitCode.OK


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(build_parser(), args.shell))
    return ExitCode.OK


class _VersionAction(argparse.Action):
    """``--version``: rvsup's, Python's and torch's versions, then exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the versions and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rvsup", description="Fault-tolerant supervisor for PyTorch training."
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("job", metavar="JOB.toml", help="the job file")
        return p

    p = add("start", "run the job in the foreground until it ends")
    p.add_argument("--quiet", action="store_true", help="no event lines on stderr")
    p.set_defaults(func=cmd_start)
    add("validate", "print the resolved configuration or every error").set_defaults(
        func=cmd_validate
    )
    p = add("status", "state, attempt, per-rank last step and heartbeat age")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until the job ends; q quits",
    )
    p.set_defaults(func=cmd_status)
    p = add("stop", "checkpoint at a common step, then stop the job (it exits 75)")
    p.add_argument("--no-wait", action="store_true", help="return once the daemon has the request")
    p.set_defaults(func=cmd_stop)
    p = add("history", "one row per attempt")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="draw the history into FILE (.png or .svg; needs the extra rvsup[plot])",
    )
    p.set_defaults(func=cmd_history)
    p = add("logs", "the ranks' stdout and stderr of an attempt (the latest by default)")
    p.add_argument("--rank", type=int, metavar="N", help="only rank N, without prefixes")
    p.add_argument("--attempt", type=int, metavar="K", help="attempt K instead of the latest")
    p.add_argument(
        "-f", "--follow", action="store_true", help="follow, across restarts, until the job ends"
    )
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("version", help="print the versions", description="print the versions")
    p.set_defaults(func=cmd_version)
    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='print a completion script: eval "$(rvsup completion bash)"',
    )
    p.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    p.set_defaults(func=cmd_completion)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _dispatch(argv)
    except BrokenPipeError:
        # the reader left (``rvsup history job.toml | head``): end quietly, as a command killed
        # by SIGPIPE would; stdout goes to /dev/null so that the interpreter's last flush of it
        # at exit cannot raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _dispatch(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    job = getattr(args, "job", None)
    if job is not None and not Path(job).is_file() and args.command != "validate":
        print(f"rvsup: {job}: no such job file", file=sys.stderr)
        return ExitCode.USAGE
    try:
        code: int = args.func(args)
    except PermissionError as exc:  # another user's job: its run directory is private (0700)
        print(f"rvsup: {_not_yours(exc, args)}", file=sys.stderr)
        return ExitCode.USAGE
    return code


def _not_yours(exc: PermissionError, args: argparse.Namespace) -> str:
    """One line for a job whose files this user may not read (another user's)."""
    where = exc.filename or getattr(args, "job", "")
    try:
        cfg = load_config(args.job)
        owner = cfg.job.run_dir.stat().st_uid
    except (ConfigError, OSError, AttributeError, TypeError):
        return f"permission denied: {where}"
    if owner == os.geteuid():
        return f"permission denied: {where}"
    return (
        f"permission denied: {where}: the job's run directory {cfg.job.run_dir} belongs to "
        f"another user (uid {owner}); only its owner can see or stop the job"
    )


if __name__ == "__main__":
    sys.exit(main())

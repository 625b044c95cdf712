"""``rvsup start|validate|status|stop|history JOB.toml``.

Exit codes: 0 success; 2 bad configuration or usage; 3 gave up; 75 (EX_TEMPFAIL) stopped on request,
preemption or time limit with the job resumable; 1 anything else (``status``/``stop`` without a
running daemon).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from supervisor.config.load import ConfigError, JobConfig, load_config, preflight, render_config
from supervisor.config.torchrun import resolve_torchrun
from supervisor.record import history, rundir, summary
from supervisor.record.schema import JobStopped
from supervisor.rules.states import ExitCode
from supervisor.service import control

__all__ = [
    "build_parser",
    "cmd_history",
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
    cfg = _load(args.job)
    issues = preflight(cfg)
    if issues:
        for issue in issues:
            print(f"rvsup: {issue.key}: {issue.message}", file=sys.stderr)
        return ExitCode.USAGE
    from supervisor.daemon import AlreadyRunningError, run_daemon

    try:
        return asyncio.run(run_daemon(cfg, console=None if args.quiet else sys.stderr))
    except AlreadyRunningError as exc:
        print(f"rvsup: {exc}", file=sys.stderr)
        return ExitCode.USAGE


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
    if args.json:
        print(json.dumps(answer, indent=2))
        return ExitCode.OK
    print(
        f"{answer['job']}: {answer['state']}, attempt {answer['attempt']}, "
        f"restarts {answer['restarts_used']}/{answer['max_restarts']}, "
        f"newest checkpoint step {answer['newest_checkpoint_step']}, "
        f"hang timeout {_fmt(answer['hang_timeout_s'])}, daemon pid {answer['pid']}"
    )
    print(f"{'rank':>4}  {'host':<16} {'pid':>8}  {'last step':>9}  {'heartbeat age':>13}  phase")
    for r in answer["ranks"]:
        print(
            f"{r['rank']:>4}  {r['host']:<16} {r['pid']:>8}  {r['last_step']:>9}  "
            f"{r['heartbeat_age_s']:>12.1f}s  {r['phase'] or ''}"
        )
    for failed in answer.get("checkpoint_failures", []):
        print(
            f"checkpoint of step {failed['step']} failed on rank {failed['rank']} "
            f"(not committed, the previous one is kept): {failed['reason']}"
        )
    msgs = answer["messages"]
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(msgs["dropped"].items())) or "none"
    print(f"messages accepted: {msgs['accepted']}; dropped: {dropped}")
    return ExitCode.OK


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def cmd_stop(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    try:
        info = json.loads((cfg.job.run_dir / rundir.DAEMON_FILE).read_text())
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


def cmd_history(args: argparse.Namespace) -> int:
    cfg = _load(args.job)
    path = cfg.job.run_dir / rundir.EVENTS_FILE
    past = history.read(path)
    rows = history.attempt_rows(past.entries)
    total = summary.summarize(rows, datetime.datetime.now(datetime.timezone.utc))
    if args.json:
        print(
            json.dumps(
                {"attempts": history.rows_to_json(rows), "summary": summary.summary_to_json(total)},
                indent=2,
            )
        )
    elif not rows:
        print(f"{cfg.job.name}: no attempts recorded in {path}")
    else:
        print(history.render_table(rows))
        print(summary.render_summary(total))
    if past.skipped:
        print(f"rvsup: skipped {past.skipped} unreadable line(s) of {path}", file=sys.stderr)
    if past.unknown:
        print(
            f"rvsup: skipped {past.unknown} line(s) of events this version does not know",
            file=sys.stderr,
        )
    return ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rvsup", description="Fault-tolerant supervisor for PyTorch training."
    )
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
    p.set_defaults(func=cmd_status)
    p = add("stop", "checkpoint at a common step, then stop the job (it exits 75)")
    p.add_argument("--no-wait", action="store_true", help="return once the daemon has the request")
    p.set_defaults(func=cmd_stop)
    p = add("history", "one row per attempt")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.job).is_file() and args.command != "validate":
        print(f"rvsup: {args.job}: no such job file", file=sys.stderr)
        return ExitCode.USAGE
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

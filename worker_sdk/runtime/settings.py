"""Where a rank's settings come from: the supervisor's environment, else the caller's arguments."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from worker_sdk.contract import protocol as p


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the runtime needs, resolved once in ``resume()``."""

    supervised: bool  # started by rvsup (heartbeats, coordinated saves)
    endpoint: str | None
    secret_file: str | None
    attempt: int
    attempt_tag: str  # names this attempt's temporary checkpoint directories
    checkpoint_dir: Path | None
    checkpoint_dir_id: str | None  # its identity when `rvsup start` checked it (None: unknown)
    every_steps: int  # 0: not by step count
    every_s: float | None  # time-based saves when not supervised (one process only)
    keep_last: int
    async_save: bool  # write checkpoints in a background process (step() blocks for staging)
    heartbeat_interval_s: float
    diagnostics_dir: Path | None
    dump_signal: int
    host: str


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    return default if raw in (None, "") else int(raw)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    return default if raw in (None, "") else float(raw)


def resolve(
    *,
    checkpoint_dir: str | os.PathLike[str] | None,
    every_steps: int | None,
    every_s: float | None,
    keep_last: int | None,
    async_save: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Under rvsup the job file (via environment) wins; standalone, arguments beat environment."""
    e = os.environ if env is None else env
    supervised = bool(e.get(p.ENV_ENDPOINT))
    env_dir = e.get(p.ENV_CHECKPOINT_DIR) or None
    if supervised:
        if (
            checkpoint_dir is not None
            and env_dir
            and Path(checkpoint_dir).resolve() != Path(env_dir)
        ):
            print(
                f"rvsup: ignoring checkpoint_dir={checkpoint_dir!s}: job.toml sets {env_dir}",
                file=sys.stderr,
            )
        chosen = env_dir
        steps = _int(e, p.ENV_CKPT_EVERY_STEPS, 0)
        seconds = None  # the supervisor coordinates time-based saves
        keep = _int(e, p.ENV_KEEP_LAST, 3)
        asynchronous = e.get(p.ENV_CKPT_ASYNC) == "1"
    else:
        chosen = str(checkpoint_dir) if checkpoint_dir is not None else env_dir
        steps = every_steps if every_steps is not None else _int(e, p.ENV_CKPT_EVERY_STEPS, 0)
        seconds = every_s if every_s is not None else (_float(e, p.ENV_CKPT_EVERY_S, 0.0) or None)
        keep = keep_last if keep_last is not None else _int(e, p.ENV_KEEP_LAST, 3)
        asynchronous = async_save if async_save is not None else e.get(p.ENV_CKPT_ASYNC) == "1"
    if steps < 0 or keep < 1 or (seconds is not None and seconds <= 0):
        raise ValueError("every_steps must be >= 0, keep_last >= 1 and every > 0")
    attempt = _int(e, p.ENV_ATTEMPT, 0)
    if supervised:
        tag = f"a{attempt}"
    elif "TORCHELASTIC_RESTART_COUNT" in e:
        tag = f"r{e.get('TORCHELASTIC_RUN_ID', 'none')}-{e['TORCHELASTIC_RESTART_COUNT']}"
    else:
        tag = f"p{os.getpid()}"
    diag = e.get(p.ENV_DIAGNOSTICS_DIR)
    return Settings(
        supervised=supervised,
        endpoint=e.get(p.ENV_ENDPOINT) or None,
        secret_file=e.get(p.ENV_SECRET_FILE) or None,
        attempt=attempt,
        attempt_tag=tag,
        checkpoint_dir=Path(chosen).resolve() if chosen else None,
        checkpoint_dir_id=(e.get(p.ENV_CHECKPOINT_DIR_ID) or None) if supervised else None,
        every_steps=steps,
        every_s=seconds,
        keep_last=keep,
        async_save=asynchronous,
        heartbeat_interval_s=_float(e, p.ENV_HEARTBEAT_INTERVAL, 1.0),
        diagnostics_dir=Path(diag) if diag else None,
        dump_signal=_int(e, p.ENV_DUMP_SIGNAL, int(p.DUMP_SIGNAL)),
        host=p.node_name(e.get("SLURMD_NODENAME"), socket.gethostname()),
    )

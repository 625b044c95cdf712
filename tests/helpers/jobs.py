"""The one writer of job.toml for the tests: the ``[job]`` table from arguments, every other
table from its TOML body. Torch-free, so that the daemon's tests use it where torch is missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.config.load import load_config
from supervisor.ranks.snapshot_home import recorded

__all__ = ["snapshot_dir", "write_job_file"]


def snapshot_dir(job_toml: Path) -> Path | None:
    """The memory tier's directory on this node that the job's daemon made and recorded in
    the run directory (supervisor/ranks/snapshot_home.py); None before its first start."""
    return recorded(load_config(job_toml).job.run_dir)


def write_job_file(
    directory: Path,
    *,
    command: Sequence[str],
    name: str = "toy",
    run_dir: str | None = "run",
    checkpoint_dir: str | None = "ckpt",
    env: Mapping[str, str] | None = None,
    job_keys: str = "",
    tables: Mapping[str, str] | None = None,
    extra: str = "",
    memory_tier: str | None = "off",
) -> Path:
    """Write ``directory/job.toml`` and return its path.

    ``run_dir``/``checkpoint_dir`` None leaves the key out (rvsup's default); ``env`` becomes
    ``[job] env``; ``job_keys`` are more ``[job]`` lines, verbatim; ``tables`` maps a table's
    name to its body (``{"restart": "max_restarts = 0"}``); ``extra`` is appended verbatim.

    ``memory_tier``: the ``memory_every_steps`` of a job whose ``[checkpoint]`` table does not
    say; ``"off"`` unless asked (the tests of everything else assert what storage checkpoints
    do: where a restart resumes, what it redoes); None: rvsup's default (``"auto"``).
    """
    lines = ["[job]", f"name = {json.dumps(name)}", f"command = {json.dumps(list(command))}"]
    for key, value in (("run_dir", run_dir), ("checkpoint_dir", checkpoint_dir)):
        if value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    if env:
        pairs = ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items())
        lines.append(f"env = {{ {pairs} }}")
    if job_keys:
        lines.append(job_keys)
    tables = dict(tables or {})
    if memory_tier is not None and "[checkpoint]" not in extra:
        body = tables.get("checkpoint", "")
        if "memory_every_steps" not in body:
            tables["checkpoint"] = f"{body}\nmemory_every_steps = {json.dumps(memory_tier)}"
    for table, body in tables.items():
        lines += ["", f"[{table}]", body]
    path = directory / "job.toml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path

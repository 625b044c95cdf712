"""How much each mode measures (trials per cell, step counts, sizes) and the shared run context."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from .tools import BashLoop, FtLauncher, Rvsup, Tool, Torchrun


@dataclass(frozen=True)
class Profile:
    """Trial counts and sizes of one mode (full, quick or smoke)."""

    name: str
    n: int  # trials per cell of the fault figures
    n_capped: int  # trials of cells that can only end at the cap (peers that never notice a hang)
    steps: int  # steps of a fault trial
    fault_step: int  # where the fault is injected
    ckpt_every: int
    hang_cap_s: float  # peers with default settings: "not detected within" this
    goodput_steps: int  # an uninterrupted run of this many steps is the goodput schedule
    n_goodput: int
    sdk_calls: int
    ckpt_sizes_mb: tuple[int, ...]
    ckpt_reps: int
    scale_ranks: tuple[int, ...]
    scale_window_s: float
    footprint_steps: int
    smoke: bool = False


FULL = Profile(
    "full",
    20,
    2,
    160,
    60,
    25,
    60.0,
    13000,
    3,
    1_000_000,
    (100, 1000),
    5,
    (64, 512, 4096),
    20.0,
    800,
)
QUICK = Profile(
    "quick", 3, 1, 120, 60, 25, 40.0, 2200, 1, 1_000_000, (100,), 3, (64, 512, 4096), 10.0, 500
)
SMOKE = Profile(
    "smoke", 1, 1, 40, 15, 10, 15.0, 150, 1, 100_000, (10,), 1, (16,), 3.0, 80, smoke=True
)
PROFILES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}
PG_TIMEOUT_S = 20.0  # the peers' process-group timeout where one is set
CONFIGURED_HANG_S = 10.0  # rvsup's and ft_launcher's configured hang/heartbeat timeout


@dataclass(frozen=True)
class Context:
    """What every figure gets: the profile, a scratch directory and the optional NVRx venv."""

    profile: Profile
    scratch: Path
    nvrx_venv: str | None

    def log(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)


def recovery_tools(ctx: Context) -> dict[str, Tool]:
    """The columns of the fault figures (smoke: rvsup and torchrun with the workaround only)."""
    tools: dict[str, Tool] = {
        "rvsup (auto)": Rvsup(hang_timeout="auto"),
        "rvsup (10 s)": Rvsup(name="rvsup", hang_timeout=f"{CONFIGURED_HANG_S:g}s"),
        "torchrun": Torchrun(share_store=True),
        "torchrun (workaround)": Torchrun(share_store=False),
        "bash loop": BashLoop(),
        "ft_launcher": FtLauncher(venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S),
    }
    if ctx.profile.smoke:
        return {k: tools[k] for k in ("rvsup (auto)", "torchrun (workaround)")}
    return tools

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
    n_crash: int  # trials per column of the crash figure (its restart success rate)
    n_capped: int  # trials of cells that can only end at the cap (peers that never notice a hang)
    n_slow: int  # trials of the peers' hang cells with a process-group timeout (20-60 s each)
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
    scale_agents: tuple[int, ...]  # ranks simulated behind node agents of AGENT_RANKS each
    # the same, each heartbeat with a loss and an all-reduce wait (a DDP script passing its loss)
    scale_training: tuple[int, ...]
    scale_window_s: float
    footprint_steps: int
    n_windows: int  # repetitions of the footprint and scale measurements
    smoke: bool = False


FULL = Profile(
    name="full",
    n=5,
    n_crash=20,
    n_capped=5,
    n_slow=5,
    steps=170,
    fault_step=110,
    ckpt_every=25,
    hang_cap_s=60.0,
    goodput_steps=13000,
    n_goodput=5,
    sdk_calls=1_000_000,
    ckpt_sizes_mb=(100, 1000),
    ckpt_reps=5,
    scale_ranks=(64, 512, 4096),
    scale_agents=(4096, 16384),
    scale_training=(16384,),
    scale_window_s=20.0,
    footprint_steps=800,
    n_windows=5,
)
QUICK = Profile(
    name="quick",
    n=3,
    n_crash=3,
    n_capped=1,
    n_slow=1,
    steps=170,
    fault_step=110,
    ckpt_every=25,
    hang_cap_s=40.0,
    goodput_steps=1500,
    n_goodput=1,
    sdk_calls=1_000_000,
    ckpt_sizes_mb=(100,),
    ckpt_reps=3,
    scale_ranks=(64, 512, 4096),
    scale_agents=(4096, 16384),
    scale_training=(16384,),
    scale_window_s=10.0,
    footprint_steps=500,
    n_windows=1,
)
SMOKE = Profile(
    name="smoke",
    n=1,
    n_crash=1,
    n_capped=1,
    n_slow=1,
    steps=90,
    fault_step=60,
    ckpt_every=25,
    hang_cap_s=15.0,
    goodput_steps=200,
    n_goodput=1,
    sdk_calls=100_000,
    ckpt_sizes_mb=(10,),
    ckpt_reps=1,
    scale_ranks=(16,),
    scale_agents=(),  # the training column's path is the agents' with more in each beat
    scale_training=(16,),
    scale_window_s=3.0,
    footprint_steps=120,
    n_windows=1,
    smoke=True,
)
PROFILES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}
PG_TIMEOUT_S = 20.0  # the peers' process-group timeout where one is set
CONFIGURED_HANG_S = 10.0  # rvsup's and ft_launcher's configured hang/heartbeat timeout


@dataclass(frozen=True)
class Context:
    """What every figure gets: the profile, a scratch directory and the peers' optional venvs."""

    profile: Profile
    scratch: Path
    nvrx_venv: str | None
    torchft_venv: str | None = None

    def log(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)


MEMORY_SHIPPED = "rvsup (memory tier as shipped)"


def recovery_tools(ctx: Context) -> dict[str, Tool]:
    """The columns of the crash figure (smoke: rvsup and torchrun with the workaround only).

    One rvsup column per way of starting ranks (a crash never waits on a hang timeout), and
    one with the memory tier as shipped (``"auto"``; the others are storage-only)."""
    tools: dict[str, Tool] = {
        "rvsup (auto)": Rvsup(hang_timeout="auto"),
        "rvsup (cold ranks)": Rvsup(hang_timeout="auto", zygote=False),
        MEMORY_SHIPPED: Rvsup(hang_timeout="auto", memory_every_steps=None),
        "torchrun": Torchrun(share_store=True),
        "torchrun (workaround)": Torchrun(share_store=False),
        "bash loop": BashLoop(),
        "ft_launcher": FtLauncher(venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S),
    }
    if ctx.profile.smoke:
        return {
            k: tools[k] for k in ("rvsup (auto)", "rvsup (cold ranks)", "torchrun (workaround)")
        }
    return tools

"""What the memory tier costs the training loop: step times with snapshots against without.

``python -m benchmarks.memory_overhead [--mb 100] [--steps 300] [--step-ms 50] [--trials 3]``

One process (no rvsup: ``RVSUP_MEMORY_DIR`` is set as rvsup sets it), a model whose state (the
parameters and Adam's two moments) is about ``--mb`` MB, a step of about ``--step-ms`` of
compute, ``--steps`` steps timed after a warm-up. Runs with the tier off and with
``memory_every_steps = "auto"`` alternate trial by trial; the overhead is the difference of the
medians of the total step time, as the loop sees it (the background writer competing for the
CPU included). It prints the interval "auto" chose, the snapshots taken and the time ``step()``
was blocked by them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]


def _child(mb: int, steps: int, step_ms: float, memory_dir: str | None) -> dict[str, float]:
    import torch
    from torch import nn

    import worker_sdk

    torch.manual_seed(0)
    width = int((mb * 2**20 / 4 / 3) ** 0.5)  # params + two Adam moments = mb
    model = nn.Linear(width, width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(8, width)
    with tempfile.TemporaryDirectory() as ckpt:
        start, _ = worker_sdk.resume(model, opt, checkpoint_dir=ckpt, every_steps=0)
        warm = 20
        began = 0.0
        first = time.perf_counter()
        for step in range(start, warm + steps):
            if step == warm:
                began = time.perf_counter()
            t0 = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            while time.perf_counter() - t0 < step_ms / 1000:  # the rest of a step's compute
                pass
            worker_sdk.step(step)
        end = time.perf_counter()
        total = end - began
        rt = worker_sdk._current
        tier = rt.memory if rt is not None else None
        out = {
            "seconds": total,
            "all_seconds": end - first,  # the warm-up too: the first snapshot falls in it
            "interval": float(tier.interval) if tier else 0.0,
            "count": float(tier.count) if tier else 0.0,
            "blocked_s": tier.blocked_s if tier else 0.0,
            "bytes": float(tier.nbytes) if tier else 0.0,
        }
        worker_sdk._reset_for_tests()
    return out


def _run(mb: int, steps: int, step_ms: float, memory: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RVSUP_")}
    env["PYTHONPATH"] = str(_REPO)
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        if memory:
            env["RVSUP_MEMORY_DIR"] = shm
            env["RVSUP_MEMORY_EVERY"] = "auto"
        args = [sys.executable, "-m", "benchmarks.memory_overhead", "--child"]
        args += ["--mb", str(mb), "--steps", str(steps), "--step-ms", str(step_ms)]
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        memory_dir = os.environ.get("RVSUP_MEMORY_DIR")
        print(json.dumps(_child(a.mb, a.steps, a.step_ms, memory_dir)))
        return
    off: list[float] = []
    auto: list[dict[str, float]] = []
    for trial in range(a.trials):
        off.append(_run(a.mb, a.steps, a.step_ms, memory=False)["seconds"])
        auto.append(_run(a.mb, a.steps, a.step_ms, memory=True))
        print(f"trial {trial + 1}: off {off[-1]:.3f}s, auto {auto[-1]}", file=sys.stderr)
    base = statistics.median(off)
    with_tier = statistics.median(r["seconds"] for r in auto)
    print(f"state {a.mb} MB, {a.steps} steps of ~{a.step_ms:g} ms, {a.trials} trials (medians)")
    print(f"  tier off : {base:.3f} s ({base / a.steps * 1000:.2f} ms/step)")
    print(f"  auto     : {with_tier:.3f} s ({with_tier / a.steps * 1000:.2f} ms/step)")
    print(f"  overhead : {(with_tier - base) / base * 100:+.2f} % of the step time")
    for r in auto:
        share = r["blocked_s"] / r["all_seconds"] * 100
        print(
            f"  auto run : interval {r['interval']:.0f} steps, {r['count']:.0f} snapshots of "
            f"{r['bytes'] / 2**20:.1f} MB, step() blocked {r['blocked_s']:.3f} s of "
            f"{r['all_seconds']:.1f} s ({share:.2f} %)"
        )


if __name__ == "__main__":
    main()

"""The goodput simulator's inputs at scale: published failure rates and causes, the component
costs measured on this machine, and the stated models that scale them to N GPUs.

Everything here is an assumption or a measurement, named and printed with the results
(:func:`assumption_lines`); :mod:`benchmarks.goodput_sim` runs the simulations.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from supervisor.rules.hangs import auto_timeout
from supervisor.rules.policy import RestartPolicy, backoff_s

from .goodput_model import Checkpointing, FaultClass, Manifest, Recovery

__all__ = [
    "LLAMA3_MIX",
    "MANIFESTS",
    "RATES",
    "Assumptions",
    "FailureRate",
    "LocalCosts",
    "assumption_lines",
    "checkpointing_for",
    "load_costs",
    "systems_at",
]

MANIFESTS: tuple[Manifest, ...] = ("crash", "hang", "node")
HOUR = 3600.0
DAY = 24 * HOUR

# Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, table 5): the 419 unexpected interruptions
# of 54 days of pre-training on 16,384 H100s, by root cause. How each shows and whether its node
# must go are this model's reading: a GPU or host fault ends the processes on it (an Xid error
# aborts the CUDA context) or hangs its collectives, and its node is replaced; a software bug
# or a timeout is restarted where it ran.
LLAMA3_MIX: tuple[FaultClass, ...] = (
    FaultClass("faulty GPU", 148, "crash", True),
    FaultClass("GPU HBM3 memory", 72, "crash", True),
    FaultClass("software bug", 54, "crash", False),
    FaultClass("network switch/cable", 35, "hang", True),
    FaultClass("host maintenance", 32, "node", True),
    FaultClass("GPU SRAM memory", 19, "crash", True),
    FaultClass("GPU system processor", 17, "hang", True),
    FaultClass("NIC", 7, "hang", True),
    FaultClass("NCCL watchdog timeouts", 7, "hang", False),
    FaultClass("silent data corruption", 6, "crash", True),
    FaultClass("GPU thermal interface and sensor", 6, "crash", True),
    FaultClass("SSD", 3, "node", True),
    FaultClass("power supply", 3, "node", True),
    FaultClass("server chassis", 2, "node", True),
    FaultClass("IO network", 2, "hang", False),
    FaultClass("dependency", 2, "crash", False),
    FaultClass("CPU", 2, "node", True),
    FaultClass("system memory", 2, "node", True),
)


@dataclass(frozen=True)
class FailureRate:
    """A published failure rate, ``per_s`` interruptions per second of a job on ``gpus`` GPUs,
    scaled to other sizes as ``(n / gpus) ** exponent`` (1: failures independent per GPU)."""

    source: str
    per_s: float
    gpus: int
    exponent: float = 1.0

    def at(self, n_gpus: int) -> float:
        """Interruptions per second of a job on ``n_gpus`` GPUs."""
        return self.per_s * float((n_gpus / self.gpus) ** self.exponent)


RATES: tuple[FailureRate, ...] = (
    # one point: failures independent per GPU
    FailureRate("Llama 3 (419 in 54 days at 16,384 GPUs)", 419 / (54 * DAY), 16384),
    # Meta's RSC clusters (Kokolis et al., 2024): MTTF 7.9 h at 1,024 GPUs and 1.8 h at 16,384;
    # the power law through both (a job's rate grows as n ** 0.53 there)
    FailureRate(
        "RSC (MTTF 7.9 h at 1,024 GPUs, 1.8 h at 16,384)",
        1 / (7.9 * HOUR),
        1024,
        math.log(7.9 / 1.8) / math.log(16),
    ),
)


@dataclass(frozen=True)
class LocalCosts:
    """Component costs measured on this machine (2 ranks on 2 cores, the benchmarks' workload):
    seconds. The defaults are docs/benchmarks.md's R17 (crash, hang, cold start) and R23 (a lost
    node on the Slurm testbed); ``python -m benchmarks.goodput_check`` measures them again."""

    source: str = "R17, R23 (docs/benchmarks.md)"
    rvsup_cold_s: float = 3.40
    rvsup_notice_crash_s: float = 0.02
    rvsup_restart_crash_s: float = 0.42  # crash MTTR less its notice (the first restart at once)
    rvsup_restart_hang_s: float = 1.44  # a SIGSTOPped rank: recovery once detected (stacks read)
    rvsup_node_restart_s: float = 3.0  # a node killed whole -> attempt 2 started (R23)
    torchrun_cold_s: float = 4.24
    torchrun_notice_crash_s: float = 0.05
    torchrun_restart_s: float = 2.85  # crash MTTR less its notice (workaround on)
    ft_cold_s: float = 4.10
    ft_notice_crash_s: float = 0.19
    ft_restart_s: float = 5.18  # crash MTTR less its notice


def load_costs(path: Path | None) -> LocalCosts:
    """The costs in ``path`` (JSON written by ``benchmarks.goodput_check``), or the defaults."""
    if path is None:
        return LocalCosts()
    raw = json.loads(path.read_text())
    known = {f.name for f in fields(LocalCosts)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}")
    return replace(LocalCosts(), **raw)


@dataclass(frozen=True)
class Assumptions:
    """The stated models that scale the local costs to a job of ``n_gpus`` (every system alike
    unless said)."""

    gpus_per_node: int = 8
    step_s: float = 6.0  # a training step at scale (the hang timeout "auto" learns from it)
    state_bytes: float = 405e9 * 14  # Llama 3 405B: bf16 weights, fp32 master copy, Adam's two
    storage_read_bytes_per_s: float = 1e12  # aggregate, shared by every GPU
    gpu_storage_bytes_per_s: float = 2e9  # one GPU's share at most
    device_to_host_bytes_per_s: float = (
        25e9  # a save's stall: the copy to host memory (saves async)
    )
    host_to_device_bytes_per_s: float = 10e9  # a restore from the memory tier
    node_link_bytes_per_s: float = 25e9  # the replica pushed to a replacement node (200 Gb/s)
    snapshot_fixed_s: float = 0.012  # a snapshot's fixed stall measured here (R19: 10-14 ms)
    storage_every_s: float = 30 * 60.0
    init_base_s: float = 5.0  # rendezvous + NCCL communicators: base +
    init_per_doubling_s: float = 2.0  # per doubling of the nodes
    requeue_s: float = 600.0  # torchrun-style: a node that must go ends the job; Slurm requeues
    torchrun_hang_s: float = 600.0  # torch's default NCCL process-group timeout (10 min)
    ft_hang_s: float = 125.0  # Megatron's step section timeout (120 s) + the monitor's 5 s check
    rvsup_backoff_s: float = 5.0  # [restart] as shipped
    rvsup_backoff_max_s: float = 300.0
    heartbeat_s: float = 1.0

    def nodes(self, n_gpus: int) -> int:
        return max(1, math.ceil(n_gpus / self.gpus_per_node))

    def init_s(self, n_gpus: int) -> float:
        return self.init_base_s + self.init_per_doubling_s * math.log2(self.nodes(n_gpus))

    def per_gpu_bytes(self, n_gpus: int) -> float:
        return self.state_bytes / n_gpus

    def storage_load_s(self, n_gpus: int) -> float:
        return self.state_bytes / min(
            self.storage_read_bytes_per_s, n_gpus * self.gpu_storage_bytes_per_s
        )

    def save_stall_s(self, n_gpus: int) -> float:
        return self.per_gpu_bytes(n_gpus) / self.device_to_host_bytes_per_s

    def rvsup_hang_s(self) -> float:
        """rvsup's hang timeout "auto" for steps of ``step_s`` (its own rule), and the tick."""
        timeout = auto_timeout(self.step_s, interval_s=self.heartbeat_s, ceiling_s=1800.0)
        assert timeout is not None
        return timeout + self.heartbeat_s


def checkpointing_for(a: Assumptions, n_gpus: int, *, memory: bool) -> Checkpointing:
    """Storage every ``storage_every_s`` (async: the copy to host memory stalls); with the
    memory tier, rvsup's ``"auto"``: a snapshot when its stall stays within 1 % of the
    training time, no more often than every step."""
    stall = a.save_stall_s(n_gpus)
    if not memory:
        return Checkpointing(a.storage_every_s, stall)
    snapshot = stall + a.snapshot_fixed_s
    every = a.step_s * max(1, math.ceil(snapshot / 0.01 / a.step_s))
    return Checkpointing(a.storage_every_s, stall, every, snapshot)


def systems_at(a: Assumptions, local: LocalCosts, n_gpus: int) -> list[tuple[Recovery, bool]]:
    """rvsup, torchrun-style and ft_launcher-style recovery for ``n_gpus``; with each, whether
    it keeps a memory tier."""
    init = a.init_s(n_gpus)
    load = a.storage_load_s(n_gpus)
    per_gpu = a.per_gpu_bytes(n_gpus)
    memory_load = (
        per_gpu / a.host_to_device_bytes_per_s + a.gpus_per_node * per_gpu / a.node_link_bytes_per_s
    )
    policy = RestartPolicy(
        max_restarts=10**9,
        backoff_s=a.rvsup_backoff_s,
        backoff_max_s=a.rvsup_backoff_max_s,
        max_no_progress=10**9,
    )

    def rvsup_backoff(used: int, in_a_row: int, rng: random.Random) -> float:
        return backoff_s(in_a_row, policy, rng.random())

    def rvsup_backoff_before(used: int, in_a_row: int, rng: random.Random) -> float:
        return backoff_s(used, policy, rng.random())  # rvsup's rule until 2026-11-29

    crash = local.rvsup_restart_crash_s + init
    hang = local.rvsup_restart_hang_s + init
    rvsup = Recovery(
        "rvsup",
        cold_start_s=local.rvsup_cold_s + init + load,
        # a node lost whole: R23's "attempt 2 started" holds the notice, establishing the lost
        # node and the launch on a spare of the allocation
        notice_s={"crash": local.rvsup_notice_crash_s, "hang": a.rvsup_hang_s(), "node": 0.0},
        restart_s={"crash": crash, "hang": hang, "node": local.rvsup_node_restart_s + init},
        # a node that must go but lives on fails once more (the shipped rule excludes a node at
        # its second failure), then a spare of the allocation takes its place
        replace_s={
            "crash": local.rvsup_notice_crash_s + crash,
            "hang": a.rvsup_hang_s() + hang,
            "node": 0.0,
        },
        load_storage_s=load,
        load_memory_s=memory_load,
        backoff=rvsup_backoff,
    )
    # torchrun as usually run under Slurm (--nnodes=N, --max-restarts): a hang ends when the
    # NCCL watchdog aborts the processes; a node that must go ends the job (its restarts fail
    # on it again), which Slurm requeues on healthy nodes
    torchrun_restart = local.torchrun_restart_s + init
    torchrun = Recovery(
        "torchrun-style",
        cold_start_s=local.torchrun_cold_s + init + load,
        notice_s={
            "crash": local.torchrun_notice_crash_s,
            "hang": a.torchrun_hang_s,
            "node": a.torchrun_hang_s,  # the survivors wait in a collective for the lost peers
        },
        restart_s=dict.fromkeys(MANIFESTS, torchrun_restart),
        replace_s=dict.fromkeys(MANIFESTS, a.requeue_s + local.torchrun_cold_s),
        load_storage_s=load,
    )
    # ft_launcher: heartbeats (sections) for hangs, in-job restarts, a hot spare taking a bad
    # node's place at once (an elastic --nnodes range and its health checks)
    ft_restart = local.ft_restart_s + init
    ft = Recovery(
        "ft_launcher-style",
        cold_start_s=local.ft_cold_s + init + load,
        notice_s={"crash": local.ft_notice_crash_s, "hang": a.ft_hang_s, "node": a.ft_hang_s},
        restart_s=dict.fromkeys(MANIFESTS, ft_restart),
        replace_s=dict.fromkeys(MANIFESTS, 0.0),
        load_storage_s=load,
    )
    before = replace(rvsup, name="rvsup, backoff by restarts used", backoff=rvsup_backoff_before)
    return [(rvsup, True), (before, True), (torchrun, False), (ft, False)]


def assumption_lines(a: Assumptions, local: LocalCosts) -> list[str]:
    """Every assumption and local cost, one per line."""
    lines = [f"local costs ({local.source}):"]
    lines += [f"  {k} = {v}" for k, v in asdict(local).items() if k != "source"]
    lines.append("scaling models:")
    lines += [f"  {k} = {v:g}" for k, v in asdict(a).items()]
    lines.append(
        "  rendezvous + NCCL init = init_base_s + init_per_doubling_s x log2(nodes); storage "
        "load = state_bytes / min(storage_read_bytes_per_s, GPUs x gpu_storage_bytes_per_s); "
        "a save's stall = state per GPU / device_to_host_bytes_per_s"
    )
    lines.append(
        f'  rvsup: hang noticed after "auto" for {a.step_s:g} s steps + a tick = '
        f"{a.rvsup_hang_s():.0f} s; [restart] as shipped (a restart after an attempt that "
        f"progressed at once; restarts in a row without progress {a.rvsup_backoff_s:g} s "
        f"doubled up to {a.rvsup_backoff_max_s:g} s, jittered down to half), max_restarts and "
        "max_no_progress set above the run's failures; a bad node that lives on fails one "
        "more start (its delay not counted), then a spare of the allocation replaces it"
    )
    return lines

"""The goodput simulator (benchmarks/goodput_model.py, goodput_scale.py, goodput_sim.py):
closed-form cases replayed exactly, the Poisson runs against the first-order formula, the
restart policy it applies, and the program's output."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import goodput_sim
from benchmarks.fig_lifecycle import mixed_faults
from benchmarks.goodput_check import (
    HANG as CHECK_HANG,
)
from benchmarks.goodput_check import (
    KILL,
    Costs,
    predict,
    schedule_faults,
)
from benchmarks.goodput_model import (
    Checkpointing,
    Failure,
    FaultClass,
    Recovery,
    replay,
    simulate,
    training_rate,
)
from benchmarks.goodput_scale import (
    LLAMA3_MIX,
    RATES,
    Assumptions,
    LocalCosts,
    checkpointing_for,
    load_costs,
    systems_at,
)
from benchmarks.records import rvsup_restart_delays

CRASH = FaultClass("bug", 1, "crash", False)
HANG = FaultClass("link", 1, "hang", False)
BAD_GPU = FaultClass("gpu", 1, "crash", True)
LOST = FaultClass("host", 1, "node", True)


def recovery(**changes: object) -> Recovery:
    """Round numbers: notice 1 s (hang 10 s), restart 20 s, replace 100 s, load 5 s, memory 1 s."""
    base = Recovery(
        "test",
        cold_start_s=30.0,
        notice_s={"crash": 1.0, "hang": 10.0, "node": 2.0},
        restart_s={"crash": 20.0, "hang": 20.0, "node": 40.0},
        replace_s={"crash": 100.0, "hang": 100.0, "node": 0.0},
        load_storage_s=5.0,
        load_memory_s=1.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


STORAGE = Checkpointing(storage_every_s=1000.0, storage_stall_s=10.0)
MEMORY = Checkpointing(1000.0, 10.0, memory_every_s=100.0, memory_stall_s=1.0)


def test_a_run_without_failures_pays_its_cold_start_and_its_stalls() -> None:
    """wall = cold start + work / rate, the rate 1 / (1 + stall / interval) per tier."""
    out = replay(10_000.0, [], recovery(), MEMORY)
    rate = 1 / (1 + 10 / 1000 + 1 / 100)
    assert training_rate(MEMORY) == pytest.approx(rate, rel=1e-12)
    assert out.wall_s == pytest.approx(30 + 10_000 / rate, rel=1e-12)
    assert out.ettr == pytest.approx(10_000 / (30 + 10_000 / rate), rel=1e-12)
    assert (out.failures, out.redone_s, out.down_s) == (0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("fault", "checkpointing", "redone", "down"),
    [
        # storage only: back to progress 1000 of 1500; notice + restart + load
        (CRASH, STORAGE, 500.0, 1 + 20 + 5),
        (HANG, STORAGE, 500.0, 10 + 20 + 5),
        (BAD_GPU, STORAGE, 500.0, 1 + 20 + 100 + 5),
        # the memory tier: back to 1500 (a snapshot every 100), loaded from memory
        (CRASH, MEMORY, 0.0, 1 + 20 + 1),
        (LOST, MEMORY, 0.0, 2 + 40 + 0 + 1),
    ],
    ids=["crash", "hang", "gpu-replaced", "crash-memory", "node-lost-memory"],
)
def test_one_failure_replayed_exactly(
    fault: FaultClass, checkpointing: Checkpointing, redone: float, down: float
) -> None:
    """A failure when the run has made 1500 s of progress: what it redoes and how long it is
    down, to the last bit of the closed form."""
    rate = training_rate(checkpointing)
    at = 30 + 1500 / rate
    out = replay(5000.0, [Failure(at, fault)], recovery(), checkpointing)
    assert out.failures == 1
    assert out.redone_s == pytest.approx(redone, abs=1e-9)
    assert out.down_s == pytest.approx(down, abs=1e-12)
    assert out.wall_s == pytest.approx(30 + (5000 + redone) / rate + down, rel=1e-12)


def test_a_system_without_a_memory_tier_goes_back_to_storage() -> None:
    """The same failure and saves, no tier: the storage checkpoint and its load."""
    at = 30 + 1500 / training_rate(MEMORY)
    out = replay(5000.0, [Failure(at, CRASH)], recovery(load_memory_s=None), MEMORY)
    assert out.redone_s == pytest.approx(500.0, abs=1e-9)
    assert out.down_s == pytest.approx(1 + 20 + 5)


def test_a_failure_during_a_recovery_or_after_the_end_is_not_replayed() -> None:
    """Only failures while the job trains count."""
    at = 30 + 1500 / training_rate(STORAGE)
    trace = [Failure(at, CRASH), Failure(at + 10, CRASH), Failure(10**9, CRASH)]
    out = replay(5000.0, trace, recovery(), STORAGE)
    assert out.failures == 1


def test_backoff_counts_restarts_in_a_row_without_progress() -> None:
    """As the daemon's budget counts them: four failures, the second and third attempts save
    nothing newer (each fails before its first checkpoint), the first and fourth do; the
    policy sees (restarts used, in a row without progress) = (0, 0), (1, 0), (2, 1), (3, 0)."""
    seen: list[tuple[int, int]] = []

    def backoff(used: int, in_a_row: int, rng: random.Random) -> float:
        seen.append((used, in_a_row))
        return 0.0

    rate = training_rate(STORAGE)
    at = [30 + 1500 / rate]  # at 1500: back to 1000, a newer checkpoint than the start's
    at.append(at[-1] + 26 + 400 / rate)  # at 1400: back to 1000 again
    at.append(at[-1] + 26 + 300 / rate)  # at 1300: back to 1000 again
    at.append(at[-1] + 26 + 1200 / rate)  # at 2200: back to 2000
    replay(5000.0, [Failure(t, CRASH) for t in at], recovery(backoff=backoff), STORAGE)
    assert seen == [(0, 0), (1, 0), (2, 1), (3, 0)]


def test_poisson_runs_agree_with_the_first_order_formula() -> None:
    """Failures at rate l, downtime D, lost work uniform over a storage interval I:
    wall = W / rate + N (D + I / 2 / rate), N = l W / rate / (1 - l I / 2 / rate)."""
    work, lam, interval = 200 * 3600.0, 1 / 7200, 600.0
    ckpt = Checkpointing(interval, 3.0)
    rec = recovery(cold_start_s=0.0, load_memory_s=None)
    d = 1 + 20 + 5
    rate = training_rate(ckpt)
    n = lam * work / rate / (1 - lam * interval / 2 / rate)
    expected = work / (work / rate + n * (d + interval / 2 / rate))
    got = [simulate(work, lam, [CRASH], rec, ckpt, random.Random(i)).ettr for i in range(200)]
    assert statistics.mean(got) == pytest.approx(expected, rel=2e-3)


def test_the_failure_mix_is_drawn_by_count() -> None:
    """Llama 3's causes come in their published proportions: ~53 % need their node replaced
    by a crash, etc.; checked on the manifest shares over 4000 draws."""
    rng = random.Random(3)
    draws = rng.choices(LLAMA3_MIX, [c.count for c in LLAMA3_MIX], k=4000)
    total = sum(c.count for c in LLAMA3_MIX)
    assert total == 419
    for manifest in ("crash", "hang", "node"):
        share = sum(c.count for c in LLAMA3_MIX if c.manifest == manifest) / total
        drawn = sum(d.manifest == manifest for d in draws) / len(draws)
        assert drawn == pytest.approx(share, abs=0.03)


def test_published_rates_reproduce_their_sources() -> None:
    """Llama 3: one interruption per ~3.1 h at 16,384 GPUs; RSC: 7.9 h at 1,024, 1.8 h at
    16,384 (the power law through both)."""
    llama, rsc = RATES
    assert 1 / llama.at(16384) / 3600 == pytest.approx(54 * 24 / 419)
    assert 1 / rsc.at(1024) / 3600 == pytest.approx(7.9)
    assert 1 / rsc.at(16384) / 3600 == pytest.approx(1.8)


def test_rvsup_hang_notice_is_its_auto_timeout() -> None:
    """rvsup notices a hang after "auto" learnt from 6 s steps (2 x 1 s + 10 x 6 s) + a tick."""
    assert Assumptions(step_s=6.0).rvsup_hang_s() == pytest.approx(63.0)


def test_the_memory_tiers_auto_interval_keeps_its_stall_within_one_percent() -> None:
    """At 1,024 GPUs a snapshot stalls ~0.23 s: every 4 steps of 6 s; at 16,384 every step."""
    a = Assumptions()
    small, large = checkpointing_for(a, 1024, memory=True), checkpointing_for(a, 16384, memory=True)
    assert small.memory_every_s == 24.0 and large.memory_every_s == 6.0
    for c in (small, large):
        assert c.memory_every_s is not None
        assert c.memory_stall_s / c.memory_every_s <= 0.01


def test_restarting_at_once_after_progress_is_never_slower() -> None:
    """The same failures (one seed) under rvsup's rule and under the rule before it (the delay
    grew with every restart used): never slower, and faster once restarts pile up."""
    a, local = Assumptions(), LocalCosts()
    by_name = {r.name: r for r, _ in systems_at(a, local, 16384)}
    ckpt = checkpointing_for(a, 16384, memory=True)
    rate = RATES[1].at(16384)
    for seed in range(5):
        now = simulate(10 * 86400, rate, LLAMA3_MIX, by_name["rvsup"], ckpt, random.Random(seed))
        before = simulate(
            10 * 86400,
            rate,
            LLAMA3_MIX,
            by_name["rvsup, backoff by restarts used"],
            ckpt,
            random.Random(seed),
        )
        assert now.failures == before.failures > 8
        assert now.wall_s < before.wall_s


def test_local_costs_from_a_file(tmp_path: Path) -> None:
    """--costs reads the JSON goodput_check writes; a key it does not know is an error."""
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"source": "here", "rvsup_cold_s": 2.5}))
    assert load_costs(path).rvsup_cold_s == 2.5 and load_costs(path).source == "here"
    path.write_text(json.dumps({"rvsup_cold": 2.5}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_costs(path)


def test_the_program_prints_every_system_at_every_scale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--smoke: one table per published rate, a row per system, the target, the assumptions;
    the JSON holds the same."""
    out = tmp_path / "sim.json"
    assert goodput_sim.main(["--smoke", "--gpus", "1024,16384", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("== Simulated ETTR") == 2
    for name in ("rvsup", "torchrun-style", "ft_launcher-style"):
        assert f"ETTR, {name}" in text
    assert "rvsup ETTR >= 0.97 at 16,384 GPUs" in text
    assert "requeue_s = 600" in text
    payload = json.loads(out.read_text())
    assert len(payload["tables"]) == 2 and payload["tables"][0]["targets"]


def test_the_program_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """A scale that is not a positive number is refused with a message."""
    with pytest.raises(SystemExit) as exit_info:
        goodput_sim.main(["--gpus", "0"])
    assert exit_info.value.code == 2
    assert "must be positive" in capsys.readouterr().err


# ---------------------------------------------------------------- the check against a run

COSTS = Costs(
    cold_s=3.0,
    end_s=1.0,
    step_s=0.01,
    notice_s=0.02,
    crash_s=0.5,
    hang_notice_s=5.0,
    hang_s=6.0,
)


def test_figure_13s_schedule_is_read_by_step() -> None:
    """Two kills and two hangs, at 15, 40, 65 and 85 % of the steps."""
    assert schedule_faults(mixed_faults(1500)) == [
        (225, KILL),
        (600, CHECK_HANG),
        (975, KILL),
        (1275, CHECK_HANG),
    ]


def test_a_fault_the_model_has_no_class_for_is_refused() -> None:
    """An OOM is neither a crash's nor a hang's recovery here: refused, naming the kinds."""
    with pytest.raises(ValueError, match="no fault class for 'oom'"):
        schedule_faults("kill:1:10,oom:0:20")


def test_the_restart_delays_are_read_from_the_history() -> None:
    """Charged restarts only, in order; a line that is not JSON is skipped."""
    lines = [
        json.dumps({"event": "restart_scheduled", "charged": True, "backoff_s": 0.0}),
        "not json",
        json.dumps({"event": "restart_scheduled", "charged": False, "backoff_s": 0.0}),
        json.dumps({"event": "failure_detected", "kind": "crash"}),
        json.dumps({"event": "restart_scheduled", "charged": True, "backoff_s": 3.7}),
    ]
    assert rvsup_restart_delays(lines) == [0.0, 3.7]


def test_the_prediction_of_figure_13_storage_only_is_its_closed_form() -> None:
    """Storage every 500 of 1500 steps: the faults redo 225 + 100 + 475 + 275 = 1075 steps
    (what every storage-only column of R19 redid); wall = cold + end + 2575 steps + two crash
    and two hang recoveries + the delays drawn."""
    faults = schedule_faults(mixed_faults(1500))
    out = predict(COSTS, 1500, 500, None, faults, [0.0, 0.0, 3.5, 0.0])
    assert out.failures == 4
    assert out.redone_s / COSTS.step_s == pytest.approx(1075)
    wall = 3.0 + 1.0 + 2575 * 0.01 + 2 * 0.5 + 2 * 6.0 + 3.5
    assert out.wall_s == pytest.approx(wall, rel=1e-12)


def test_the_prediction_with_snapshots_every_5_steps_redoes_nothing_of_a_fault_at_a_snapshot() -> (
    None
):
    """Faults at steps that are multiples of 5 go back to themselves with the tier."""
    faults = schedule_faults(mixed_faults(1500))
    out = predict(COSTS, 1500, 500, 5, faults, [0.0] * 4)
    assert out.redone_s == pytest.approx(0.0, abs=1e-9)
    assert out.wall_s == pytest.approx(3.0 + 1.0 + 15.0 + 2 * 0.5 + 2 * 6.0, rel=1e-12)


def test_a_fault_at_a_snapshots_step_goes_back_to_it_whatever_the_step_time() -> None:
    """Figure 13's faults all fall on steps that are multiples of 5: with steps of 9.537... ms
    the progress at them comes out a rounding error below a snapshot's, which must not cost a
    whole interval."""
    costs = replace(COSTS, step_s=0.009537456976449605)
    out = predict(costs, 1500, 500, 5, schedule_faults(mixed_faults(1500)), [0.0] * 4)
    assert out.redone_s == pytest.approx(0.0, abs=1e-9)

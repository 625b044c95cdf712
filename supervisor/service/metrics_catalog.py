"""Every metric of ``[metrics]``: name, type, help and labels (pure; no prometheus-client).

:mod:`supervisor.service.metrics` creates them from this table, and docs/metrics.md is generated
from it (``python -m tests.docgen``), so a metric cannot go undocumented.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["LABEL_VALUES", "METRICS"]

METRICS: Final[Mapping[str, tuple[str, str, tuple[str, ...]]]] = {
    # each metric by name: its type, help text and labels
    "rvsup_state": ("gauge", "1 for the job's current state, 0 for the others", ("state",)),
    "rvsup_attempt": ("gauge", "The current attempt's number (1-based)", ()),
    "rvsup_restarts_used": ("gauge", "Charged restarts used of the budget", ()),
    "rvsup_restarts_left": ("gauge", "Charged restarts left before the job gives up", ()),
    "rvsup_restarts_total": ("counter", "Restarts scheduled (restart_scheduled)", ()),
    "rvsup_failures_total": ("counter", "Failures detected, by kind (failure_detected)", ("kind",)),
    "rvsup_resumes_total": (
        "counter",
        "Resumes checked, by verdict: verified, diverged, unverified (resume_*)",
        ("verdict",),
    ),
    "rvsup_rank_last_step": ("gauge", "The last step each rank finished", ("rank",)),
    "rvsup_rank_heartbeat_age_seconds": (
        "gauge",
        "Seconds since each rank's last message",
        ("rank",),
    ),
    "rvsup_step_seconds": ("gauge", "The median recent step time over every rank", ()),
    "rvsup_checkpoints_total": ("counter", "Checkpoints committed, by tier", ("tier",)),
    "rvsup_checkpoint_seconds_total": (
        "counter",
        "Time checkpoint saves took, by tier",
        ("tier",),
    ),
    "rvsup_checkpoint_bytes_total": (
        "counter",
        "Bytes of committed checkpoints, by tier",
        ("tier",),
    ),
    "rvsup_checkpoint_blocked_seconds_total": (
        "counter",
        "Time checkpoint saves blocked the training, by tier",
        ("tier",),
    ),
    "rvsup_checkpoint_last_step": (
        "gauge",
        "The step of the newest committed checkpoint",
        ("tier",),
    ),
    "rvsup_steps_redone": ("gauge", "Finished steps a later attempt ran again (whole job)", ()),
    "rvsup_wall_seconds": ("gauge", "Wall time of the job's attempts (whole job)", ()),
    "rvsup_goodput_seconds": ("gauge", "Time spent on training steps that were kept", ()),
    "rvsup_goodput_ratio": ("gauge", "Goodput seconds over wall seconds", ()),
    "rvsup_badput_seconds": ("gauge", "Time not spent on kept steps, by source", ("source",)),
}
"""Every metric: its type, help and labels (docs/metrics.md is generated from this)."""

LABEL_VALUES: Final[Mapping[str, str]] = {
    "state": "`starting`, `running`, `saving`, `stopping`, `tearing_down`, `backoff`, "
    "`succeeded`, `gave_up`, `stopped`",
    "kind": "the `kind` of `failure_detected` (docs/events.md)",
    "rank": "the global rank",
    "tier": "`storage` (a memory tier will add `memory`)",
    "source": "`startup`, `checkpoint_save`, `wasted_progress`, `hang_detection`, `backoff`, "
    "`recovery`",
}
"""What each label's values are, for the documentation."""

"""Times NVIDIA resiliency extension's ``RankMonitorClient.send_heartbeat()`` in one rank.

Run under ``ft_launcher --nproc-per-node=1`` (it needs the launcher's rank monitor); prints one line
``NVRX_PROBE {"median_us": ..., "min_us": ..., "max_us": ..., "n": ...}``.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import time


def main() -> None:
    ft = importlib.import_module("nvidia_resiliency_ext.fault_tolerance")
    n = int(os.environ.get("NVRX_PROBE_CALLS", "5000"))
    client = ft.RankMonitorClient()
    client.init_workload_monitoring()
    for _ in range(100):  # warm up
        client.send_heartbeat()
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        client.send_heartbeat()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    client.shutdown_workload_monitoring()
    result = {
        "median_us": statistics.median(times),
        "min_us": min(times),
        "max_us": max(times),
        "n": n,
    }
    print("NVRX_PROBE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

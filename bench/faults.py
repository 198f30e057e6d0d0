"""Fault to fenced: how soon a GPU fault an agent sees takes the GPU out of service.

    .venv/bin/python bench/faults.py [--rounds 10] [--sample-interval 2]

The faults each round injects and what ``fault_to_fenced_ms`` measures:
docs/development/design-notes.md, "Fault to fenced: bench/faults.py".
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import (
    delete_redis_keys,
    process_env,
    start_worker_and_agent,
    stop,
    throwaway_database,
    wait_for,
)

QUEUE = f"bench-faults-{os.getpid()}"
HOSTNAME = f"bench-{os.getpid()}-faults"
MODEL = "dgx-a100-80gb"
TARGET_MEDIAN_MS = 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sample-interval", type=int, default=2, help="the agent's GPUADMIN_SAMPLE_INTERVAL_S"
    )
    args = parser.parse_args()

    os.environ["GPUADMIN_CENTRAL_QUEUE"] = QUEUE  # read when Django is set up
    os.environ.setdefault("LOG_LEVEL", "warning")
    scratch = Path(tempfile.mkdtemp(prefix="gpuadmin-bench-faults-"))
    sim_dir = scratch / "data" / "sim"  # the agent's simulator state (GPUADMIN_DATA_DIR/sim)
    with throwaway_database("gpuadmin_bench_faults") as database_url:
        from django.contrib.auth import get_user_model

        from gpuadmin.audit.models import AuditEvent
        from inventory.choices import GpuState
        from inventory.models import Gpu
        from inventory.nvml.sim import faults
        from inventory.services import set_gpu_state

        env = process_env(
            database_url,
            scratch,
            GPUADMIN_SAMPLE_INTERVAL_S=str(args.sample_interval),
            GPUADMIN_BREAKER_MIN_GPUS="100000",
            GPUADMIN_FLAP_LIMIT="100000",
        )
        processes = start_worker_and_agent(env, scratch, HOSTNAME, MODEL)
        admin = get_user_model().objects.create_superuser("bench-admin")

        def fenced_at(gpu: Gpu, since: float) -> float | None:
            """When the health policy first changed the GPU's state after ``since``."""
            row = (
                AuditEvent.objects.filter(
                    event_type="gpu.state_changed",
                    target_id=gpu.uuid,
                    actor_name="health",
                    time__gte=datetime.fromtimestamp(since, UTC),
                )
                .order_by("time")
                .first()
            )
            return None if row is None else row.time.timestamp()

        def state(index: int) -> str:
            return Gpu.objects.values_list("state", flat=True).get(
                node__hostname=HOSTNAME, index=index
            )

        def inject(kind: str, index: int, turn: int) -> None:
            if kind == "xid 79 (lost)":
                faults.fall_off_bus(sim_dir, HOSTNAME, index)
            elif kind == "ecc uncorrected":
                # Counts only grow, as a real GPU's aggregate count does (clearing the fault
                # zeroes the simulator's counters; the same count again would be the same
                # report, which the central side rightly stores once).
                faults.set_ecc(sim_dir, HOSTNAME, index, count=8 * turn, error="uncorrected")
            else:
                faults.inject_xid(sim_dir, HOSTNAME, index, int(kind.split()[1]))

        def back_online(index: int) -> None:
            faults.clear(sim_dir, HOSTNAME, index)
            wait_for(lambda: state(index) != GpuState.RESETTING, 60, "a reset to end")
            gpu = Gpu.objects.get(node__hostname=HOSTNAME, index=index)
            set_gpu_state(gpu, GpuState.AVAILABLE, actor=admin, reason="bench: fault cleared")

        kinds = ("xid 79 (lost)", "xid 48", "ecc uncorrected", "xid 74")
        finished = False
        delays: dict[str, list[float]] = {kind: [] for kind in kinds}
        try:
            print(
                f"1 simulated {MODEL} agent, samples every {args.sample_interval} s, "
                f"{args.rounds} rounds of {len(kinds)} faults; {os.cpu_count()} cores "
                f"(load average {os.getloadavg()[0]:.1f})"
            )
            turn = 0
            for _ in range(args.rounds):
                for kind in kinds:
                    index = turn % 8
                    turn += 1
                    time.sleep(args.sample_interval)  # a clean sample first: a fresh baseline
                    gpu = Gpu.objects.get(node__hostname=HOSTNAME, index=index)
                    injected = time.time()
                    inject(kind, index, turn)
                    wait_for(
                        lambda: fenced_at(gpu, injected) is not None,  # noqa: B023
                        30,
                        f"{kind} on GPU {index} to fence it",
                    )
                    fenced = fenced_at(gpu, injected)
                    assert fenced is not None
                    delays[kind].append((fenced - injected) * 1000)
                    back_online(index)
            finished = True
        finally:
            stop(processes)
            delete_redis_keys({QUEUE, HOSTNAME})
            if finished:
                shutil.rmtree(scratch, ignore_errors=True)
            else:
                print(f"the processes' logs are kept in {scratch}", file=sys.stderr)

    every = [delay for values in delays.values() for delay in values]
    for kind, values in delays.items():
        print(f"{kind:16} x{len(values):<3} median {statistics.median(values):6.0f} ms")
    median = statistics.median(every)
    print(
        f"all              x{len(every):<3} median {median:6.0f} ms, max {max(every):.0f} ms "
        f"(target: median under {TARGET_MEDIAN_MS} ms)\n"
    )
    print(f"fault_to_fenced_ms: {median:.0f} ms")
    print(f"fault_to_fenced_ms_max: {max(every):.0f} ms")


if __name__ == "__main__":
    main()

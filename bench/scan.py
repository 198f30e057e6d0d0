"""Time full NVML scans (facts, metrics, MIG, topology, health) of a simulated machine, or of
this host's GPUs through the real NVML (`--nvml real`, on a GPU host).

    .venv/bin/python bench/scan.py [--model dgx-a100-40gb] [--runs 500] [--nvml real]

Ends with headline lines `name: value unit`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from inventory.nvml import open_backend, scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dgx-a100-40gb")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--nvml", choices=("sim", "real"), default="sim")
    args = parser.parse_args()

    if args.nvml == "real":
        backend, machine = open_backend("real"), "this host (real NVML)"
    else:
        backend = open_backend("sim", sim_model=args.model, node_name=f"{args.model}-bench")
        machine = f"model {args.model}"
    first = scan(backend)
    gpus = first.system.gpu_count
    failed = [gpu.index for gpu in first.gpus if gpu.error_message]
    if first.system.error or not gpus or failed:
        sys.exit(f"scan of {machine} is not clean: {first.system.error or failed or 'no GPU'}")
    mig = sum(1 for gpu in first.gpus if gpu.mig and gpu.mig.enabled)

    for _ in range(args.warmup):
        scan(backend)
    timings = []
    for _ in range(args.runs):
        started = time.perf_counter()
        scan(backend)
        timings.append((time.perf_counter() - started) * 1000)
    timings.sort()
    median = statistics.median(timings)
    p95 = timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))]
    fastest = timings[0]

    print(f"{machine}: {gpus} GPUs, {mig} with MIG enabled, {args.runs} full scans")
    print(f"{'':10}{'median':>10}{'p95':>10}{'min':>10}")
    print(f"{'per scan':10}{median:>8.2f}ms{p95:>8.2f}ms{fastest:>8.2f}ms")
    print(f"{'per GPU':10}{median / gpus:>8.2f}ms{p95 / gpus:>8.2f}ms{fastest / gpus:>8.2f}ms")
    print()
    print(f"scan_median_ms: {median:.2f} ms")
    print(f"scan_p95_ms: {p95:.2f} ms")
    print(f"scan_min_ms: {fastest:.2f} ms")
    print(f"scan_per_gpu_median_ms: {median / gpus:.2f} ms")


if __name__ == "__main__":
    main()

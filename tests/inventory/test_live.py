"""Live samples in the real Redis."""

import time
import uuid

from inventory import live
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults


def test_published_samples_read_back_per_node():
    host_a, host_b = (f"live-{uuid.uuid4().hex[:6]}" for _ in range(2))
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host_a)
    faults.start_process(nvml, None, 3, 4242, used_mib=30_000, util=97)
    scanned = scan(nvml, include=("facts", "metrics"))

    before = time.time()
    live.publish(host_a, scanned)

    found = live.latest([host_a, host_b])
    assert found[host_b] == {}
    samples = found[host_a]
    assert set(samples) == {gpu.facts.uuid for gpu in scanned.gpus}
    busy = samples[scanned.gpus[3].facts.uuid]
    assert busy["index"] == 3
    assert busy["utilization_gpu_pct"] == 97
    assert busy["memory_used_mib"] >= 30_000
    assert busy["memory_total_mib"] == 40960
    assert busy["processes"] == 1
    assert busy["sampled_at"] >= before
    assert samples[scanned.gpus[0].facts.uuid]["utilization_gpu_pct"] is None  # MIG: N/A
    ttl = live.client().ttl(live.KEY_PREFIX + host_a)
    assert 0 < ttl <= 30


def test_a_new_publish_replaces_the_old_samples():
    host = f"live-{uuid.uuid4().hex[:6]}"
    live.publish(host, scan(SimulatedNvml.from_model("dgx-h100", node_name=host)))
    live.publish(host, scan(SimulatedNvml.from_model("rtx-4080-super", node_name=host)))
    assert len(live.latest([host])[host]) == 1

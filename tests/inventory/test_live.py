"""Live samples in the real Redis."""

import json
import time
import uuid

from inventory import live
from inventory.agent import SAMPLE_SECTIONS
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


def test_the_samples_of_named_gpus_alone():
    host, silent = (f"live-{uuid.uuid4().hex[:6]}" for _ in range(2))
    scanned = scan(SimulatedNvml.from_model("dgx-a100-40gb", node_name=host), include=("metrics",))
    live.publish(host, scanned)
    everything = live.latest([host])[host]
    second, fifth = (scanned.gpus[index].facts.uuid for index in (2, 5))

    found = live.latest_of(
        [(host, fifth), (host, "GPU-unknown"), (silent, "GPU-x"), (host, second)]
    )

    assert found == {host: {fifth: everything[fifth], second: everything[second]}, silent: {}}


def test_a_new_publish_replaces_the_old_samples():
    host = f"live-{uuid.uuid4().hex[:6]}"
    live.publish(host, scan(SimulatedNvml.from_model("dgx-h100", node_name=host)))
    live.publish(host, scan(SimulatedNvml.from_model("rtx-4080-super", node_name=host)))
    assert len(live.latest([host])[host]) == 1


def test_each_publish_adds_one_entry_to_the_sample_stream(settings):
    host = f"live-{uuid.uuid4().hex[:6]}"
    redis = live.client()
    stream = settings.GPUADMIN_SAMPLE_STREAM
    newest = redis.xrevrange(stream, count=1)
    after = newest[0][0].decode() if newest else "0-0"
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host)
    faults.start_process(nvml, None, 0, 4242, used_mib=3000, gpu_instance=3)
    faults.start_process(nvml, None, 5, 4343, used_mib=20_000, util=80)

    live.publish(host, scan(nvml, include=SAMPLE_SECTIONS))
    live.publish(host, scan(nvml, include=SAMPLE_SECTIONS))

    mine = [
        fields
        for _, fields in redis.xrange(stream, min=f"({after}")
        if fields[b"node"] == host.encode()
    ]
    assert len(mine) == 2
    assert float(mine[1][b"at"]) >= float(mine[0][b"at"])
    gpus = json.loads(mine[1][b"gpus"])
    assert gpus == live.latest([host])[host]  # the same samples as the live hash
    whole, mig = (next(s for s in gpus.values() if s["index"] == i) for i in (5, 0))
    assert whole["pids"] == [[4343, 20_000]] and whole["processes"] == 1
    assert whole["utilization_gpu_pct"] == 80 and whole["memory_temperature_c"] is not None
    assert (whole["ecc_uncorrected"], whole["nvlink_errors"], whole["pcie_tx_kbps"]) == (0, 0, 9600)
    assert whole["remapped_rows_pending"] is False and whole["retired_pages_sbe"] is None
    # MIG: utilization is not measurable (None, never 0); each MIG device shows its memory.
    assert mig["utilization_gpu_pct"] is None and mig["pids"] == [[4242, 3000]]
    assert [(d["gi_id"], d["profile"], d["memory_used_mib"]) for d in mig["mig"]] == [
        (2, "3g.20gb", 0),
        (3, "2g.10gb", 3000),
        (4, "2g.10gb", 0),
    ]


def test_the_loop_reads_each_sample_cut_to_its_fields():
    """``latest_for_loop`` gives what ``latest`` gives, each sample cut to ``LOOP_FIELDS``
    (from the field ``publish`` writes beside the samples, which ``latest`` leaves out)."""
    host, silent = (f"live-{uuid.uuid4().hex[:6]}" for _ in range(2))
    nvml = SimulatedNvml.from_model("dgx-a100-40gb", node_name=host)
    faults.start_process(nvml, None, 5, 4343, used_mib=20_000, util=80)
    live.publish(host, scan(nvml, include=SAMPLE_SECTIONS))
    faults.fall_off_bus(nvml, None, 6)  # published under the UUID seen before, with its error
    live.publish(host, scan(nvml, include=SAMPLE_SECTIONS))

    everything = live.latest([host, silent])
    found = live.latest_for_loop([host, silent])

    assert found == {
        host: {
            gpu: {name: sample[name] for name in live.LOOP_FIELDS if name in sample}
            for gpu, sample in everything[host].items()
        },
        silent: {},
    }
    samples = list(found[host].values())
    assert len(samples) == 8
    working = [sample for sample in samples if not sample["error_message"]]
    assert sorted(sample["processes"] for sample in working) == [0] * 6 + [1]
    assert sum("GPU_IS_LOST" in (sample["error_message"] or "") for sample in samples) == 1

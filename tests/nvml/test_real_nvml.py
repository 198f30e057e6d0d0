"""The scanner against the real pynvml backend: invariants on a GPU host, a clear "why not"
everywhere else."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from inventory.nvml import NodeScan, open_backend, scan
from inventory.nvml.real import RealNvml, nvidia_smi_topo_matrix, probe
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.importer import model_from_capture
from tests.nvml.captures import OWN
from tests.nvml.scan_invariants import assert_clean_scan, assert_round_trip, assert_sane_mig


@pytest.fixture(scope="module")
def real_scan() -> NodeScan:
    status = probe()
    if not status.available:
        pytest.skip(f"no NVIDIA driver/GPU: {status.reason}")
    return scan(open_backend("real"))


@pytest.mark.gpu
def test_real_scan_is_clean_and_self_consistent(real_scan: NodeScan) -> None:
    assert_clean_scan(real_scan)


@pytest.mark.gpu
def test_real_scan_matches_probe(real_scan: NodeScan) -> None:
    status = probe()
    assert real_scan.system.gpu_count == status.gpu_count
    assert real_scan.system.driver_version == status.driver_version


@pytest.mark.gpu
def test_real_mig_profile_table_is_sane_on_mig_capable_gpus(real_scan: NodeScan) -> None:
    capable = [gpu.index for gpu in real_scan.gpus if gpu.facts.mig_enabled is not None]
    if not capable:
        pytest.skip("no MIG-capable GPU on this host")
    for index in capable:
        assert_sane_mig(real_scan, index)


@pytest.mark.gpu
def test_real_scan_sections_can_be_left_out(real_scan: NodeScan) -> None:
    facts_only = scan(open_backend("real"), include=("facts",))
    assert facts_only.topology is None
    assert [gpu.uuid for gpu in facts_only.gpus] == [gpu.uuid for gpu in real_scan.gpus]
    assert all(gpu.metrics is None and gpu.mig is None for gpu in facts_only.gpus)


@pytest.mark.gpu
def test_this_hosts_capture_imported_into_the_simulator_scans_as_the_real_nvml(
    real_scan: NodeScan,
) -> None:
    """`gpuadmin sim import` of this host's own `nvidia-smi -q -x` and `topo -m`: the simulator
    gives back what the real NVML reports, facts, topology, MIG and health counters alike."""
    smi_xml = subprocess.run(
        ["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    model = model_from_capture(smi_xml, nvidia_smi_topo_matrix(), name="this-host")
    simulated = scan(SimulatedNvml.from_model(model, node_name="this-host"))

    def system(result: NodeScan) -> tuple:
        info = result.system
        return (info.driver_version, info.cuda_driver_version, info.nvml_version,
                info.gpu_count, info.error)  # fmt: skip

    def facts(result: NodeScan) -> list[dict]:
        readings = {"memory_used_mib", "memory_free_mib"}  # they move between the two reads
        return [
            {k: v for k, v in gpu.facts.to_dict().items() if k not in readings}
            for gpu in result.gpus
        ]

    assert system(simulated) == system(real_scan)
    assert facts(simulated) == facts(real_scan)
    assert simulated.topology == real_scan.topology
    assert [gpu.mig for gpu in simulated.gpus] == [gpu.mig for gpu in real_scan.gpus]
    assert [gpu.health for gpu in simulated.gpus] == [gpu.health for gpu in real_scan.gpus]


def test_scan_without_nvml_library_returns_no_gpus_and_says_why() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("libnvidia-ml.so.1 is installed on this host")

    result = scan(open_backend("real"))

    reason = "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver installed"
    assert result.system.error == reason
    assert result.system.gpu_count == 0
    assert result.gpus == ()
    assert result.topology is None
    assert probe().reason == reason
    assert_round_trip(result)


def test_nic_affinity_on_real_nodes_comes_from_nvidia_smi_topo_m(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVML has no NIC API: the real backend's source is nvidia-smi's own matrix.
    fake = tmp_path / "nvidia-smi"
    capture = OWN / "dgx1-v100__topo-m_no-numa-column.txt"
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = 'topo -m' ] && exec /bin/cat '{capture}'\nexit 9\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert RealNvml().topo_matrix_text() == capture.read_text()
    fake.unlink()
    assert RealNvml().topo_matrix_text() is None  # no nvidia-smi: no NICs, no error

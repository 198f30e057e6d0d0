"""`gpuadmin scan`: the NVML layer from the command line."""

import json
import re

import pytest

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# nvidia-smi topo -m of a DGX A100 (fixtures/real/topo/gengwg__DGX-A100__topo-m.txt)
DGX_A100_NUMA = [3, 3, 1, 1, 7, 7, 5, 5]
DGX_A100_CPUS = (
    ["48-63,176-191"] * 2 + ["16-31,144-159"] * 2 + ["112-127,240-255"] * 2 + ["80-95,208-223"] * 2
)


@pytest.fixture(scope="module")
def dgx_a100_scan(tmp_path_factory):
    import subprocess
    import sys

    from tests.conftest import REPO_DIR

    result = subprocess.run(
        [sys.executable, "-m", "gpuadmin", "scan", "--sim", "dgx-a100-40gb", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_DIR,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_scan_without_a_gpu_says_so_clearly(run_gpuadmin):
    result = run_gpuadmin("scan")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "gpuadmin scan: no usable NVIDIA GPU: NVML library (libnvidia-ml.so.1) not found: "
        "no NVIDIA driver installed"
    )


def test_scan_json_without_a_gpu_is_an_empty_device_list(run_gpuadmin):
    result = run_gpuadmin("scan", "--json")
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["gpus"] == []
    assert "libnvidia-ml.so.1" in body["system"]["error"]


def test_sim_dgx_a100_gpus_have_real_identities(dgx_a100_scan):
    gpus = dgx_a100_scan["gpus"]
    assert len(gpus) == 8
    facts = [gpu["facts"] for gpu in gpus]
    assert {f["name"] for f in facts} == {"NVIDIA A100-SXM4-40GB"}
    assert all(UUID.match(f["uuid"]) for f in facts)
    assert len({f["uuid"] for f in facts}) == 8
    assert [f["pci_bus_id"] for f in facts] == [
        f"00000000:{bus}:00.0" for bus in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
    ]
    assert {f["memory_total_mib"] for f in facts} == {40960}
    assert [f["numa_node"] for f in facts] == DGX_A100_NUMA
    assert [f["cpu_affinity"] for f in facts] == DGX_A100_CPUS
    assert all(f["error_message"] is None for f in facts)


def test_sim_dgx_a100_topology_is_nvswitch_all_to_all(dgx_a100_scan):
    matrix = dgx_a100_scan["topology"]["matrix"]
    for i in range(8):
        for j in range(8):
            assert matrix[i][j] == ("X" if i == j else "NV12"), (i, j)


def test_sim_dgx_a100_mig_tables_and_layouts(dgx_a100_scan):
    gpus = dgx_a100_scan["gpus"]
    profiles = {p["name"]: p for p in gpus[2]["mig"]["profiles"]}
    assert profiles["1g.5gb"]["id"] == 19
    assert profiles["1g.5gb"]["instances"] == 7
    assert (profiles["3g.20gb"]["placements"], profiles["3g.20gb"]["memory_slices"]) == ([0, 4], 4)
    assert profiles["7g.40gb"]["compute_slices"] == 7
    enabled = [gpu["facts"]["index"] for gpu in gpus if gpu["mig"]["enabled"]]
    assert enabled == [0, 1]
    for index in enabled:
        instances = gpus[index]["mig"]["gpu_instances"]
        assert instances
        cis = [ci for gi in instances for ci in gi["compute_instances"]]
        assert all(MIG_UUID.match(ci["uuid"]) for ci in cis)
    assert gpus[2]["mig"]["gpu_instances"] == []


def test_a_fault_injected_from_the_cli_shows_in_the_next_scan(run_gpuadmin, tmp_path):
    state = str(tmp_path / "sim")
    scan_args = ("scan", "--sim", "dgx-h100", "--node", "h100-07", "--state-dir", state, "--json")
    assert json.loads(run_gpuadmin(*scan_args).stdout)["gpus"][3]["facts"]["error_message"] is None

    injected = run_gpuadmin("sim", "inject", "lost", "h100-07", "3", "--state-dir", state)
    assert injected.returncode == 0, injected.stderr

    gpus = json.loads(run_gpuadmin(*scan_args).stdout)["gpus"]
    assert "NVML_ERROR_GPU_IS_LOST" in gpus[3]["facts"]["error_message"]
    assert gpus[3]["health"]["gpu_lost"] is True
    assert [gpu["facts"]["error_message"] for i, gpu in enumerate(gpus) if i != 3] == [None] * 7


def test_an_imported_capture_scans_back_to_the_captured_machine(run_gpuadmin, tmp_path):
    from tests.conftest import SHARED_DIR

    real = SHARED_DIR / "fixtures" / "real"
    model = tmp_path / "h100-box.json"
    imported = run_gpuadmin(
        "sim",
        "import",
        str(real / "nvidia-smi-q-xml" / "k8s-test-infra__hardware__qx-h100.xml"),
        str(real / "topo" / "stas00-ml-engineering__8xH100-SXM__topo-m_no-NICs.txt"),
        "--name",
        "h100-box",
        "--output",
        str(model),
    )
    assert imported.returncode == 0, imported.stderr

    scanned = json.loads(run_gpuadmin("scan", "--sim", str(model), "--json").stdout)

    assert [gpu["facts"]["name"] for gpu in scanned["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert scanned["system"]["driver_version"] == "580.105.08"
    matrix = scanned["topology"]["matrix"]
    assert {matrix[i][j] for i in range(8) for j in range(8) if i != j} == {"NV18"}

"""``nvidia-smi -L`` parser over every real -L capture (bundles: test_parsers_bundles)."""

from pathlib import Path

import pytest

from inventory.nvml.parsers import parse_gpu_list
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
LIST_FILES = sorted(
    p for p in (REAL / "mig").glob("*nvidia-smi-L-*.txt") if not p.name.endswith(".source.txt")
)

# (GPU name, GPU uuid, MIG profile names in device order), read off the files.
EXPECTED = {
    "nvidia_gpu_exporter__H100-80GB-HBM3__nvidia-smi-L-mig.txt": (
        "NVIDIA H100 80GB HBM3",
        "GPU-00000000-0000-0000-0000-000000000000",
        ["MIG 3g.40gb", "MIG 2g.20gb", "MIG 1g.10gb", "MIG 1g.10gb"],
    ),
    "nvidia_gpu_exporter__H200__nvidia-smi-L-mig.txt": (
        "NVIDIA H200",
        "GPU-00000000-0000-0000-0000-000000000000",
        ["MIG 1c.3g.71gb", "MIG 2c.3g.71gb", "MIG 2g.35gb", "MIG 1g.18gb", "MIG 1g.18gb"],
    ),
    "scaleway__H100-PCIe__nvidia-smi-L-mig.txt": (
        "NVIDIA H100 PCIe",
        "GPU-7cd6d4d6-9fa8-13be-3c42-09a1b2280a02",
        ["MIG 3g.40gb", "MIG 1g.10gb", "MIG 1g.10gb", "MIG 1g.10gb"],
    ),
}


@pytest.mark.parametrize("path", LIST_FILES, ids=lambda p: p.name)
def test_every_capture_parses_with_expected_values(path: Path) -> None:
    assert path.name in EXPECTED, f"new capture {path.name}: add its verified values"
    name, uuid, profiles = EXPECTED[path.name]
    (gpu,) = parse_gpu_list(path.read_text())
    assert (gpu.index, gpu.name, gpu.uuid) == (0, name, uuid)
    assert [m.profile for m in gpu.mig_devices] == profiles
    assert [m.index for m in gpu.mig_devices] == list(range(len(profiles)))
    assert all(m.uuid.startswith("MIG-") and m.gpu_instance_id is None for m in gpu.mig_devices)


def test_scaleway_mig_uuids() -> None:
    (gpu,) = parse_gpu_list(
        (REAL / "mig" / "scaleway__H100-PCIe__nvidia-smi-L-mig.txt").read_text()
    )
    assert gpu.mig_devices[3].uuid == "MIG-6d96b431-44ba-5360-80b0-9359561c927d"


def test_old_mig_gpu_uuid_form_and_plain_gpus() -> None:
    text = (
        "GPU 0: A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
        "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0)\n"
        "  MIG 3g.20gb Device 1: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/2/0)\n"
        "GPU 1: Tesla T4 (UUID: GPU-d37e67a5-91dd-3774-a5cb-99096249601a)\n"
    )
    gpus = parse_gpu_list(text)
    assert [g.name for g in gpus] == ["A100-SXM4-40GB", "Tesla T4"]
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in gpus[0].mig_devices] == [
        (1, 0),
        (2, 0),
    ]
    assert gpus[1].mig_devices == ()


def test_noise_is_ignored() -> None:
    assert parse_gpu_list("No devices were found\n") == []

"""MIG GPU instance create/destroy (inventory.nvml.mig_ops) against the NVML simulator."""

from __future__ import annotations

import pytest

from inventory.nvml.mig_ops import (
    MigErrorCode,
    MigOperationError,
    create_gpu_instance,
    destroy_gpu_instance,
)
from inventory.nvml.scanner import GpuInstance, scan
from inventory.nvml.sim import SimulatedNvml, faults

A100_PROFILES = "1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb, 1g.5gb+me, 1g.10gb"


@pytest.fixture
def nvml() -> SimulatedNvml:
    # GPU 0: 3g.20gb (GI 2 at 4) + 2x 2g.10gb (GI 3 at 0, GI 4 at 2); GPU 1: 7x 1g.5gb;
    # GPU 2: MIG disabled.
    return SimulatedNvml.from_model("dgx-a100-40gb", node_name="mig-ops-01")


def layout(nvml: SimulatedNvml, gpu: int) -> list[tuple[int, str, int, list[int]]]:
    instances: tuple[GpuInstance, ...] = scan(nvml, include=("mig",)).gpus[gpu].mig.gpu_instances
    return [
        (gi.gi_id, gi.profile_name, gi.placement_start, [ci.ci_id for ci in gi.compute_instances])
        for gi in instances
    ]


def refused(call, *args) -> MigOperationError:
    with pytest.raises(MigOperationError) as caught:
        call(*args)
    return caught.value


def test_destroy_then_create_round_trip(nvml):
    destroy_gpu_instance(nvml, 0, 3)
    destroy_gpu_instance(nvml, 0, 4)
    assert layout(nvml, 0) == [(2, "3g.20gb", 4, [0])]

    assert create_gpu_instance(nvml, 0, "3g.20gb") == (1, 0)
    assert layout(nvml, 0) == [(1, "3g.20gb", 0, [0]), (2, "3g.20gb", 4, [0])]

    destroy_gpu_instance(nvml, 0, 1)
    destroy_gpu_instance(nvml, 0, 2)
    assert create_gpu_instance(nvml, 0, "MIG 7g.40gb") == (0, 0)  # NVML's own name works too
    assert layout(nvml, 0) == [(0, "7g.40gb", 0, [0])]


def test_create_at_a_placement_and_the_full_size_compute_instance(nvml):
    destroy_gpu_instance(nvml, 0, 2)
    assert create_gpu_instance(nvml, 0, "2g.10gb", placement_start=4) == (5, 0)
    mig = scan(nvml, include=("mig",)).gpus[0].mig
    created = next(gi for gi in mig.gpu_instances if gi.gi_id == 5)
    assert (created.placement_start, created.placement_size) == (4, 2)
    assert [ci.name for ci in created.compute_instances] == ["2g.10gb"]  # the whole GI


def test_overlap_is_refused_and_changes_nothing(nvml):
    before = layout(nvml, 0)
    error = refused(create_gpu_instance, nvml, 0, "3g.20gb", 0)
    assert error.code is MigErrorCode.NO_ROOM
    assert error.message == (
        "no room for 3g.20gb at placement 0 on GPU 0: NVML_ERROR_INSUFFICIENT_RESOURCES"
    )
    error = refused(create_gpu_instance, nvml, 1, "1g.5gb")
    assert error.message == "no room for 1g.5gb on GPU 1: NVML_ERROR_INSUFFICIENT_RESOURCES"
    assert layout(nvml, 0) == before


def test_a_placement_the_profile_lacks_is_refused(nvml):
    destroy_gpu_instance(nvml, 0, 2)
    error = refused(create_gpu_instance, nvml, 0, "3g.20gb", 3)
    assert error.code is MigErrorCode.INVALID_PLACEMENT
    assert error.message == "placement 3 is not valid for 3g.20gb on GPU 0; valid starts: 0, 4"


def test_mig_disabled_and_mig_less_gpus_are_refused(nvml):
    error = refused(create_gpu_instance, nvml, 2, "1g.5gb")
    assert (error.code, error.message) == (MigErrorCode.MIG_DISABLED, "MIG is not enabled on GPU 2")
    error = refused(destroy_gpu_instance, nvml, 2, 7)
    assert error.message == "MIG is not enabled on GPU 2"

    l40s = SimulatedNvml.from_model("pcie-l40s-4x")
    error = refused(create_gpu_instance, l40s, 0, "1g.5gb")
    assert (error.code, error.message) == (
        MigErrorCode.MIG_NOT_SUPPORTED,
        "GPU 0 does not support MIG",
    )


def test_unknown_profile_and_gpu_are_refused(nvml):
    error = refused(create_gpu_instance, nvml, 0, "9g.99gb")
    assert error.code is MigErrorCode.UNKNOWN_PROFILE
    assert error.message == f"unknown profile 9g.99gb; GPU 0 offers: {A100_PROFILES}"
    error = refused(create_gpu_instance, nvml, 8, "1g.5gb")
    assert (error.code, error.message) == (
        MigErrorCode.NO_SUCH_GPU,
        "no GPU 8 on this node (8 GPUs)",
    )


def test_destroying_an_unknown_gpu_instance_is_refused(nvml):
    error = refused(destroy_gpu_instance, nvml, 0, 9)
    assert (error.code, error.message) == (
        MigErrorCode.NO_SUCH_INSTANCE,
        "GPU 0 has no GPU instance 9",
    )


def test_a_gpu_instance_with_running_processes_is_not_destroyed(nvml):
    faults.start_process(nvml, None, 0, 4242, used_mib=1000, gpu_instance=2, compute_instance=0)
    error = refused(destroy_gpu_instance, nvml, 0, 2)
    assert error.code is MigErrorCode.IN_USE
    assert error.message == (
        "compute instance 0 of GPU instance 2 on GPU 0 is in use (processes are running in it): "
        "NVML_ERROR_IN_USE"
    )
    assert (2, "3g.20gb", 4, [0]) in layout(nvml, 0)


def test_every_operation_shuts_nvml_down_again(nvml, monkeypatch):
    calls = []
    for name in ("nvmlInit", "nvmlShutdown"):
        original = getattr(nvml, name)
        monkeypatch.setattr(nvml, name, lambda o=original, n=name: calls.append(n) or o())
    destroy_gpu_instance(nvml, 0, 2)
    create_gpu_instance(nvml, 0, "3g.20gb")
    refused(create_gpu_instance, nvml, 0, "3g.20gb")
    refused(destroy_gpu_instance, nvml, 0, 2 + 40)
    assert calls == ["nvmlInit", "nvmlShutdown"] * 4


def test_an_nvml_that_cannot_start_is_reported(nvml, monkeypatch):
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(nvml, "nvmlInit", no_driver)
    error = refused(create_gpu_instance, nvml, 0, "1g.5gb")
    assert error.code is MigErrorCode.NVML_UNAVAILABLE
    assert "NVIDIA kernel driver not loaded" in error.message


def test_the_simulator_state_is_shared_through_the_state_dir(tmp_path):
    def backend() -> SimulatedNvml:
        return SimulatedNvml.from_model("dgx-a100-40gb", node_name="shared", state_dir=tmp_path)

    destroy_gpu_instance(backend(), 0, 2)
    assert create_gpu_instance(backend(), 0, "3g.20gb", 4) == (2, 0)
    assert (2, "3g.20gb", 4, [0]) in layout(backend(), 0)

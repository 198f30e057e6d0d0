"""The one rule for whether a GPU can take a whole-GPU job now (``inventory.usability``), and
``Gpu.objects.schedulable()`` as exactly its stored part."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from django.utils import timezone

from inventory import live, usability
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.usability import (
    Reason,
    sample_unusable,
    stored_unusable,
    why_unusable,
)

USABLE = {
    "node_state": "online",
    "reachable": True,
    "gpu_state": "available",
    "missing": False,
    "error_message": "",
    "mig_enabled": False,
    "mps_shared": False,
    "sample": {"error_message": None, "processes": 0},
    "allocated": False,
}
LOST = {"error_message": "NVML_ERROR_GPU_IS_LOST: GPU is lost", "sampled_at": 1.0}


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({}, None),
        ({"sample": None}, None),  # no sample yet: the stored rows decide
        ({"sample": {"processes": 2}, "allocated": True}, None),  # the job's own processes
        ({"node_state": "offline"}, Reason.OFFLINE),
        ({"gpu_state": "offline"}, Reason.OFFLINE),
        ({"node_state": "draining"}, Reason.DRAINING),
        ({"gpu_state": "draining"}, Reason.DRAINING),
        ({"gpu_state": "degraded"}, Reason.DEGRADED),
        ({"gpu_state": "resetting"}, Reason.RESETTING),
        ({"gpu_state": "degraded", "node_state": "draining"}, Reason.DEGRADED),
        ({"reachable": False}, Reason.UNREACHABLE),
        ({"missing": True}, Reason.MISSING),
        ({"error_message": "Unknown Error"}, Reason.ERROR),
        ({"mig_enabled": True}, Reason.MIG),
        ({"mps_shared": True}, Reason.MPS),
        ({"mps_shared": True, "sample": {"processes": 2}, "allocated": True}, Reason.MPS),
        ({"mig_enabled": True, "mps_shared": True}, Reason.MIG),
        ({"mps_shared": True, "gpu_state": "draining"}, Reason.DRAINING),
        ({"mps_shared": True, "sample": LOST}, Reason.ERROR),
        ({"mps_shared": True, "sample": {"processes": 3}}, Reason.MPS),
        ({"sample": LOST}, Reason.ERROR),
        ({"sample": LOST, "allocated": True}, Reason.ERROR),
        ({"sample": {"processes": 1}}, Reason.FOREIGN_PROCESS),
        # The gravest reason wins, wherever it comes from.
        ({"node_state": "offline", "reachable": False, "missing": True}, Reason.OFFLINE),
        ({"reachable": False, "error_message": "x"}, Reason.UNREACHABLE),
        ({"gpu_state": "draining", "sample": LOST}, Reason.ERROR),
        ({"mig_enabled": True, "sample": LOST}, Reason.ERROR),
        ({"mig_enabled": True, "sample": {"processes": 3}}, Reason.MIG),
        ({"gpu_state": "draining", "sample": {"processes": 3}}, Reason.DRAINING),
        # A real node that confines no job (its agent refuses them), after the states.
        ({"refuses_unconfined": True}, Reason.UNCONFINED),
        ({"refuses_unconfined": True, "mig_enabled": True}, Reason.UNCONFINED),
        ({"refuses_unconfined": True, "gpu_state": "draining"}, Reason.DRAINING),
        # Work outside gpuadmin (a Slurm job) holds it: before MIG and MPS, so neither a slice
        # nor a share of it is given; its processes are that work's, not foreign.
        ({"held_outside": "Slurm job 7 on hpc"}, Reason.HELD_OUTSIDE),
        ({"held_outside": "Slurm job 7 on hpc", "mig_enabled": True}, Reason.HELD_OUTSIDE),
        ({"held_outside": "Slurm job 7 on hpc", "mps_shared": True}, Reason.HELD_OUTSIDE),
        ({"held_outside": "Slurm job 7 on hpc", "gpu_state": "draining"}, Reason.DRAINING),
    ],
)
def test_why_unusable(changes, code):
    why = why_unusable(**{**USABLE, **changes})
    assert (why and why.code) == code
    assert why is None or why.message


def test_messages_say_which_part_and_carry_the_nvml_error():
    assert why_unusable(**{**USABLE, "node_state": "draining"}).message == "its node is draining"
    assert why_unusable(**{**USABLE, "gpu_state": "offline"}).message == "the GPU is offline"
    lost = sample_unusable(LOST, allocated=False)
    assert "NVML_ERROR_GPU_IS_LOST" in lost.message
    foreign = sample_unusable({"processes": 2}, allocated=False)
    assert foreign.message == "2 process(es) run on it outside any allocation"


def test_the_rule_is_pure_python():
    """The placement engine may import it: no Django, no database, no Redis."""
    tree = ast.parse(Path(usability.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= {"__future__", "collections", "dataclasses", "enum", "functools", "typing"}


@pytest.mark.django_db
def test_schedulable_queryset_is_exactly_the_stored_rule():
    """Every combination of the stored reasons (3,840, every GPU state of the state machine):
    the queryset keeps a GPU exactly when ``stored_unusable`` finds nothing."""
    now = timezone.now()
    stale = now - timezone.timedelta(hours=1)
    expected = {}
    combos = itertools.product(
        ("online", "draining", "offline"),  # node state
        (True, False),  # reachable
        GpuState.values,  # GPU state: available, draining, degraded, resetting, offline
        (False, True),  # missing
        ("", "Unknown Error"),  # error
        (False, True),  # MIG mode
        (False, True),  # shared through MPS
        (False, True),  # a real node that confines no job, unconfined jobs not allowed
        ("", "Slurm job 7 on hpc"),  # held outside gpuadmin
    )
    for n, combo in enumerate(combos):
        node_state, reachable, gpu_state, missing, error, mig, mps, refusing, held = combo
        node = Node.objects.create(
            hostname=f"rule-{n}",
            state=node_state,
            last_heartbeat_at=now if reachable else stale,
            nvml_backend="real",
            isolation="none" if refusing else "cgroup v2 (devices, kill, cpu_time)",
        )
        gpu = Gpu.objects.create(
            uuid=f"GPU-rule-{n}",
            node=node,
            index=0,
            name="NVIDIA A100-SXM4-40GB",
            pci_bus_id=f"0000:{n:04X}:00.0",
            state=gpu_state,
            missing_since=now if missing else None,
            error_message=error,
            mig_enabled=mig,
            mps_shared=mps,
            held_outside=held,
        )
        why = stored_unusable(
            node_state=node_state,
            reachable=reachable,
            gpu_state=gpu_state,
            missing=missing,
            error_message=error,
            mig_enabled=mig,
            mps_shared=mps,
            refuses_unconfined=node.refuses_unconfined,
            held_outside=held,
        )
        expected[gpu.pk] = why is None
    found = set(Gpu.objects.schedulable(now).values_list("pk", flat=True))
    assert found == {pk for pk, usable in expected.items() if usable}
    assert len(found) == 1


def test_the_rule_reads_the_states_inventory_defines():
    from inventory.choices import GpuState, NodeState

    assert usability.ONLINE == NodeState.ONLINE and usability.AVAILABLE == GpuState.AVAILABLE
    assert usability.OFFLINE == NodeState.OFFLINE == GpuState.OFFLINE
    assert usability.DEGRADED == GpuState.DEGRADED and usability.RESETTING == GpuState.RESETTING
    from inventory.choices import ISOLATION_NONE, NvmlBackend

    assert usability.REAL_NVML == NvmlBackend.REAL and usability.ISOLATION_NONE == ISOLATION_NONE


@pytest.mark.parametrize(
    ("backend", "isolation", "allowed", "refuses"),
    [
        ("real", "none", False, True),
        ("real", "none", True, False),  # an admin allowed unconfined jobs
        ("sim", "none", False, False),  # simulated GPUs: nobody else's at stake
        ("real", "cgroup v2 (devices, kill, cpu_time)", False, False),
        ("real", "", False, False),  # not said yet (an older agent)
    ],
)
def test_a_real_node_whose_agent_confines_nothing_takes_no_job_unless_allowed(
    backend, isolation, allowed, refuses
):
    assert (
        usability.refuses_unconfined_jobs(
            nvml_backend=backend, isolation=isolation, allow_unconfined=allowed
        )
        == refuses
    )


class _Recording(dict):
    """A sample that notes the fields read of it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> object:
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("allocated", [False, True])
@pytest.mark.parametrize("fields", [{}, LOST, {"processes": 2, "error_message": None}])
def test_the_live_part_reads_only_the_fields_the_loop_reads(fields, allocated):
    """The placement loop reads samples cut to ``live.LOOP_FIELDS``: the rule reads no other."""
    sample = _Recording({"sampled_at": 1.0, "temperature_c": 40, "memory_used_mib": 7, **fields})
    sample_unusable(sample, allocated=allocated)
    assert sample.read <= set(live.LOOP_FIELDS)

"""What each node runs on: its agent says real NVML or the simulator (with the machine model it
simulates) when it registers, and the catalog keeps it."""

from __future__ import annotations

import os

import pytest
from django.utils.html import escape

from gpuadmin.audit.models import AuditEvent
from inventory import tasks
from inventory.choices import NvmlBackend
from inventory.models import Node
from inventory.services import register_node
from tests.inventory.conftest import simulated_agent_sync

pytestmark = pytest.mark.django_db


def test_an_agent_registers_the_backend_and_model_it_runs_on(settings, tmp_path):
    name, args = simulated_agent_sync(settings, tmp_path)
    assert name == "inventory.sync_node"
    tasks.sync_node(*args)
    node = Node.objects.get(hostname="box-01")
    assert (node.nvml_backend, node.model) == (NvmlBackend.SIM, "pcie-l40s-4x")


def test_a_node_that_changes_backend_is_audited():
    register_node("gpu-07", model="8x NVIDIA H100 80GB HBM3", nvml_backend=NvmlBackend.SIM)
    register_node("gpu-07", model="8x NVIDIA H100 80GB HBM3", nvml_backend=NvmlBackend.REAL)
    assert Node.objects.get(hostname="gpu-07").nvml_backend == NvmlBackend.REAL
    changed = AuditEvent.objects.get(event_type="node.agent_changed")
    assert (changed.before, changed.after) == ({"nvml_backend": "sim"}, {"nvml_backend": "real"})


def test_an_agent_that_does_not_say_keeps_what_is_known():
    register_node("gpu-08", nvml_backend=NvmlBackend.REAL)
    register_node("gpu-08")
    assert Node.objects.get(hostname="gpu-08").nvml_backend == NvmlBackend.REAL


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="'cuda' is not an NVML backend"):
        register_node("gpu-09", nvml_backend="cuda")
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("uid", "job_account", "label"),
    [(0, "per owner", "their owners' accounts"), (65534, "nobody", "the agent's account, nobody")],
    ids=["root", "not-root"],
)
def test_an_agent_says_whose_account_its_jobs_run_as_and_the_api_and_fleet_show_it(
    settings, tmp_path, monkeypatch, admin_client, uid, job_account, label
):
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    _, args = simulated_agent_sync(settings, tmp_path)
    monkeypatch.undo()
    tasks.sync_node(*args)

    node = Node.objects.get(hostname="box-01")
    assert (node.job_account, node.job_account_label()) == (job_account, label)
    assert admin_client.get("/api/v1/nodes/box-01/").json()["job_account"] == job_account
    assert escape(f"jobs run as {label}") in admin_client.get("/fleet/").content.decode()


def test_a_root_agent_told_to_run_jobs_as_itself_says_so(settings, monkeypatch):
    """`gpuadmin up`'s demo agents (--jobs-as-agent): the demo's people have no Unix accounts."""
    from inventory.agent import job_account, jobs_run_as_owner

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert (jobs_run_as_owner(), job_account()) == (True, "per owner")
    settings.GPUADMIN_JOBS_AS_OWNER = "off"
    assert (jobs_run_as_owner(), job_account()) == (False, "root")

"""MIG re-layout (``scheduling.sharing.relayout``): named and custom layouts by the real placement
rules, and the workflow's steps on a simulated DGX A100 whose agent answers in-process
(drain, apply, verify by a re-scan, done), with its deadlines, rollbacks and audit rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.leases import services as leases
from gpuadmin.leases.models import Lease
from inventory.agent import node_backend
from inventory.choices import GpuState
from inventory.models import Gpu, MigInstance
from inventory.nvml import mig_catalog, mig_ops
from inventory.services import AgentTimedOut, MigChangeRefused, create_mig_instance, discover_node
from scheduling.models import Allocation, Job, JobState, MigRelayout, RelayoutState
from scheduling.sharing import relayout
from scheduling.sharing.relayout import RelayoutRefused, current_layout, fit, named_layout
from tests.inventory.conftest import node  # noqa: F401 - the simulated node fixture
from tests.scheduling.conftest import processes_gone

A100_40 = mig_catalog.load_table("a100-sxm4-40gb")
H100 = mig_catalog.load_table("h100-sxm5-80gb")
A30 = mig_catalog.load_table("a30-pcie-24gb")
# The simulated GPU 0: 2g.10gb at 0 and 2, 3g.20gb at 4.
INITIAL = [("2g.10gb", 0), ("2g.10gb", 2), ("3g.20gb", 4)]


def pairs(layout) -> list[tuple[str, int]]:
    return sorted((item["profile"], item["start"]) for item in layout)


def test_named_layouts_follow_the_placement_rules():
    assert relayout.layout_names(A100_40) == ("all-1g.5gb", "balanced")
    assert pairs(named_layout(A100_40, "all-1g.5gb")) == [("1g.5gb", s) for s in range(7)]
    assert pairs(named_layout(A100_40, "balanced")) == [
        ("1g.5gb", 2),
        ("1g.5gb", 3),
        ("2g.10gb", 0),
        ("3g.20gb", 4),
    ]
    assert pairs(named_layout(H100, "balanced")) == [
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("2g.20gb", 0),
        ("3g.40gb", 4),
    ]
    assert pairs(named_layout(H100, "all-3g.40gb")) == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_named_and_custom_layouts_of_a_four_slice_a30():
    # NVIDIA mig-parted's A30 (0x20B710DE) "all-balanced" is 2x 1g.6gb + 1x 2g.12gb and
    # "all-1g.6gb" 4x 1g.6gb (../shared/fixtures/real/mig-profiles/mig-parted__config-default.yaml).
    assert relayout.layout_names(A30) == ("all-1g.6gb", "balanced")
    assert pairs(named_layout(A30, "all-1g.6gb")) == [("1g.6gb", s) for s in range(4)]
    assert pairs(named_layout(A30, "balanced")) == [("1g.6gb", 2), ("1g.6gb", 3), ("2g.12gb", 0)]
    assert pairs(fit(A30, [{"profile": "4g.24gb"}])) == [("4g.24gb", 0)]
    with pytest.raises(RelayoutRefused, match="do not fit together"):
        fit(A30, [{"profile": "2g.12gb"}, {"profile": "2g.12gb+me"}, {"profile": "1g.6gb"}])
    with pytest.raises(RelayoutRefused, match="2g.12gb starts at 0, 2, not 1"):
        fit(A30, [{"profile": "2g.12gb", "start": 1}])


@pytest.mark.parametrize(
    ("wanted", "error"),
    [
        ([{"profile": "3g.20gb", "start": 0}, {"profile": "4g.20gb"}], "do not fit together"),
        ([{"profile": "7g.40gb"}, {"profile": "1g.5gb"}], "do not fit together"),
        ([{"profile": "3g.20gb", "start": 2}], "3g.20gb starts at 0, 4, not 2"),
        ([{"profile": "9g.99gb"}], "item 1: no profile '9g.99gb'"),
        (["1g.5gb"], "item 1: give"),
    ],
)
def test_a_custom_layout_that_breaks_the_rules_is_refused(wanted, error):
    with pytest.raises(RelayoutRefused, match=error) as refused:
        fit(A100_40, wanted)
    assert refused.value.field == "layout"


def test_a_custom_layout_gets_its_starts():
    wanted = [{"profile": "4g.20gb"}, {"profile": "2g.10gb"}, {"profile": "1g.5gb", "start": 6}]
    assert pairs(fit(A100_40, wanted)) == [("1g.5gb", 6), ("2g.10gb", 4), ("4g.20gb", 0)]


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("mig-admin", is_staff=True)


def steps(item: MigRelayout) -> list[str]:
    return list(
        AuditEvent.objects.filter(target_type="scheduling.migrelayout", target_id=str(item.pk))
        .order_by("pk")
        .values_list("event_type", flat=True)
    )


def advance(item: MigRelayout) -> MigRelayout:
    return relayout.advance(item.pk)


def test_drain_apply_verify_done(node, admin):  # noqa: F811
    gpu = node.gpu(0)
    item = relayout.request(gpu, "all-1g.5gb", actor=admin)
    gpu.refresh_from_db()
    assert (item.state, gpu.state) == (RelayoutState.DRAINING, GpuState.DRAINING)
    assert gpu.state_reason == "MIG re-layout to all-1g.5gb"
    assert pairs(item.previous_layout) == INITIAL
    assert advance(item).state == RelayoutState.APPLYING
    assert advance(item).state == RelayoutState.VERIFYING
    assert pairs(current_layout(gpu)) == [("1g.5gb", s) for s in range(7)]
    done = advance(item)
    assert done.state == RelayoutState.DONE
    assert done.message == " + ".join(f"1g.5gb@{s}" for s in range(7)) + " verified by a re-scan"
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    assert steps(item) == [
        "mig_relayout.draining",
        "mig_relayout.applying",
        "mig_relayout.verifying",
        "mig_relayout.done",
    ]
    created = AuditEvent.objects.filter(event_type="gpu.mig_instance_created")
    assert set(created.values_list("actor_name", flat=True)) == {"mig-relayout"}
    assert created.count() == 7
    assert advance(item).state == RelayoutState.DONE  # nothing more to do


def test_one_gpu_of_a_node_at_a_time(node, admin):  # noqa: F811
    relayout.request(node.gpu(0), "balanced", actor=admin)
    with pytest.raises(RelayoutRefused, match="has a MIG re-layout under way \\(GPU 0\\)"):
        relayout.request(node.gpu(1), "balanced", actor=admin)
    assert node.gpu(1).state == GpuState.AVAILABLE


def test_refusals_name_the_field(node, admin):  # noqa: F811
    with pytest.raises(RelayoutRefused) as refused:
        relayout.request(node.gpu(2), "balanced", actor=admin)  # not in MIG mode
    assert refused.value.field == "gpu"
    with pytest.raises(RelayoutRefused) as refused:
        relayout.request(node.gpu(0), "all-9g", actor=admin)
    assert refused.value.field == "layout_name"
    Gpu.objects.filter(pk=node.gpu(0).pk).update(state=GpuState.DEGRADED)
    with pytest.raises(RelayoutRefused, match="not available"):
        relayout.request(node.gpu(0), "balanced", actor=admin)
    assert not MigRelayout.objects.exists()


def holding_job(owner, gpu: Gpu) -> Job:
    job = Job.objects.create(
        owner=owner, command=["x"], state="running", attempt=1, mig_profile="2g.10gb"
    )
    device = gpu.mig_instances.order_by("gi_id").first()
    Allocation.objects.create(
        job=job, gpu=gpu, node=gpu.node, attempt=1, kind="mig", mig_instance=device
    )
    return job


def test_it_waits_for_the_jobs_then_gives_up_at_the_deadline(node, admin):  # noqa: F811
    gpu = node.gpu(0)
    job = holding_job(admin, gpu)
    item = relayout.request(gpu, "balanced", actor=admin)
    assert advance(item).state == RelayoutState.DRAINING
    MigRelayout.objects.filter(pk=item.pk).update(
        step_deadline=timezone.now() - timedelta(seconds=1)
    )
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert failed.message == "waiting for its jobs: its jobs did not end before the drain deadline"
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    assert pairs(current_layout(gpu)) == INITIAL  # nothing was applied
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert steps(item)[-1] == "mig_relayout.failed"


def test_preempting_requeues_the_jobs_once_their_processes_are_gone(node, admin, monkeypatch):  # noqa: F811
    """The jobs are stopped at once; the layout changes once their agents report their
    processes gone (no process on the GPU while it is re-laid out)."""
    gpu = node.gpu(0)
    job = holding_job(admin, gpu)
    item = relayout.request(gpu, "balanced", actor=admin, preempt=True)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    said = f"preempted: GPU 0 of {gpu.node.hostname} gets a new MIG layout"
    stopped = AuditEvent.objects.get(event_type="job.stopping", target_id=str(job.pk))
    assert (stopped.actor_name, stopped.message) == ("mig-relayout", said)  # not health
    assert advance(item).state == RelayoutState.DRAINING
    assert processes_gone(job) == JobState.QUEUED
    assert job.message == said
    assert advance(item).state == RelayoutState.APPLYING


@pytest.mark.parametrize("leaves", [GpuState.DEGRADED, GpuState.OFFLINE])
def test_a_gpu_that_leaves_draining_is_not_reconfigured(node, admin, leaves):  # noqa: F811
    """Health fenced it, or an admin took it offline, while it drained: the workflow ends
    without touching its layout, and the GPU keeps the state it was given."""
    gpu = node.gpu(0)
    item = relayout.request(gpu, "all-1g.5gb", actor=admin)
    Gpu.objects.filter(pk=gpu.pk).update(state=leaves)
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert failed.message.startswith(
        f"waiting for its jobs: the GPU left draining (it is {leaves})"
    )
    assert pairs(current_layout(gpu)) == INITIAL
    gpu.refresh_from_db()
    assert gpu.state == leaves


def test_no_one_but_the_workflow_changes_the_layout_while_it_owns_the_gpu(node, admin):  # noqa: F811
    """Dynamic MIG (the loop's task) and an admin's change on the node's MIG page are both
    refused from the drain on; the re-layout's own steps go through."""
    gpu = node.gpu(0)
    item = relayout.request(gpu, "all-1g.5gb", actor=admin)
    for who in ({"actor_name": "placement-loop"}, {"actor": admin}):
        with pytest.raises(MigChangeRefused) as refused:
            create_mig_instance(gpu, "1g.5gb", **who)
        assert refused.value.code == "vetoed"
        assert refused.value.message.endswith(f"is being re-laid out (MIG re-layout {item.pk})")
    assert advance(item).state == RelayoutState.APPLYING
    assert advance(item).state == RelayoutState.VERIFYING


def test_a_layout_is_read_only_for_custom_and_a_start_is_a_slice_number():
    assert relayout.asked_layout("balanced", "1g.5gb@x") is None  # a named layout ignores it
    with pytest.raises(RelayoutRefused) as refused:
        relayout.asked_layout(relayout.CUSTOM, "1g.5gb@" + "9" * 5000)
    assert refused.value.field == "layout"


def test_a_refused_apply_rolls_back_and_returns_the_gpu(node, admin, monkeypatch):  # noqa: F811
    gpu = node.gpu(0)
    real = relayout.create_mig_instance
    calls: list[str] = []

    def failing(gpu, profile, **kwargs):
        calls.append(profile)
        if profile == "1g.5gb":
            raise MigChangeRefused("no room for 1g.5gb", "no_room")
        return real(gpu, profile, **kwargs)

    monkeypatch.setattr(relayout, "create_mig_instance", failing)
    item = relayout.request(gpu, "balanced", actor=admin)
    advance(item)
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert failed.message.startswith("applying the layout: the agent refused: no room for 1g.5gb")
    assert failed.message.endswith("rolled back to 2g.10gb@0 + 2g.10gb@2 + 3g.20gb@4")
    assert pairs(current_layout(gpu)) == INITIAL
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE


def test_a_busy_gpu_is_tried_again_until_the_deadline(node, admin, monkeypatch):  # noqa: F811
    def busy(*args, **kwargs):
        raise MigChangeRefused("busy: 1 process(es) running on it", "busy")

    monkeypatch.setattr(relayout, "destroy_mig_instance", busy)
    item = relayout.request(node.gpu(0), "balanced", actor=admin)
    advance(item)
    assert advance(item).state == RelayoutState.APPLYING
    MigRelayout.objects.filter(pk=item.pk).update(
        step_deadline=timezone.now() - timedelta(seconds=1)
    )
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert "the agent refused: busy" in failed.message


def test_a_draining_relayout_can_be_canceled(node, admin):  # noqa: F811
    gpu = node.gpu(0)
    item = relayout.request(gpu, "balanced", actor=admin)
    canceled = relayout.cancel(item, actor=admin)
    assert (canceled.state, canceled.message) == (RelayoutState.CANCELED, "canceled by mig-admin")
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE
    with pytest.raises(RelayoutRefused, match="only a re-layout still draining"):
        relayout.cancel(item, actor=admin)
    # The node is free for the next one.
    assert relayout.request(node.gpu(1), "balanced", actor=admin).state == RelayoutState.DRAINING


def test_a_rescan_that_shows_another_layout_rolls_back(node, admin):  # noqa: F811
    """Someone changed the GPU behind the workflow's back (nvidia-smi on the node) between
    its apply and its verify: the re-scan says so, and the GPU goes back to its old layout."""
    gpu = node.gpu(0)
    item = relayout.request(gpu, "balanced", actor=admin)
    advance(item)
    assert advance(item).state == RelayoutState.VERIFYING
    one = MigInstance.objects.filter(gpu=gpu, profile_name="1g.5gb").first()
    mig_ops.destroy_gpu_instance(node_backend(), gpu.index, one.gi_id)
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert failed.message.startswith("verifying by a re-scan: the re-scan shows 2g.10gb@0 + ")
    assert failed.message.endswith("rolled back to 2g.10gb@0 + 2g.10gb@2 + 3g.20gb@4")
    discover_node(gpu.node)  # what the hardware has, not what the catalog says
    assert pairs(current_layout(gpu)) == INITIAL
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE


def test_a_rollback_the_agent_refuses_says_what_the_gpu_was_left_with(node, admin, monkeypatch):  # noqa: F811
    real = relayout.create_mig_instance

    def refusing(gpu, profile, **kwargs):
        if profile in ("1g.5gb", "2g.10gb"):  # the new layout's, then the rollback's
            raise MigChangeRefused(f"no room for {profile}", "no_room")
        return real(gpu, profile, **kwargs)

    monkeypatch.setattr(relayout, "create_mig_instance", refusing)
    gpu = node.gpu(0)
    item = relayout.request(gpu, "balanced", actor=admin)
    advance(item)
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert "the agent refused: no room for 1g.5gb" in failed.message
    assert failed.message.endswith(
        "; the rollback failed too (no room for 2g.10gb): its layout is 2g.10gb@0 + 3g.20gb@4"
    )
    gpu.refresh_from_db()
    assert gpu.state == GpuState.AVAILABLE  # returned, its layout as the message says


def test_an_agent_that_times_out_while_applying_fails_it_and_rolls_back(node, admin, monkeypatch):  # noqa: F811
    real = relayout.create_mig_instance

    def silent(gpu, profile, **kwargs):
        if profile == "1g.5gb":
            raise AgentTimedOut(f"{gpu.node.hostname}'s agent did not answer within 20 s")
        return real(gpu, profile, **kwargs)

    monkeypatch.setattr(relayout, "create_mig_instance", silent)
    gpu = node.gpu(0)
    item = relayout.request(gpu, "balanced", actor=admin)
    advance(item)
    failed = advance(item)
    assert failed.state == RelayoutState.FAILED
    assert "agent did not answer within 20 s" in failed.message
    assert failed.message.endswith("rolled back to 2g.10gb@0 + 2g.10gb@2 + 3g.20gb@4")
    assert pairs(current_layout(gpu)) == INITIAL


@pytest.mark.parametrize(
    ("step", "state"),
    [
        ("_apply", RelayoutState.APPLYING),  # to verifying (_enter)
        ("discover_node", RelayoutState.VERIFYING),  # to done, the GPU given back (_finish)
    ],
)
def test_an_advance_whose_lease_was_taken_over_commits_nothing(
    node,  # noqa: F811
    admin,
    monkeypatch,
    step,
    state,
):
    """The worker advancing a re-layout stalls in a step past its lease's time (the agent's
    calls take seconds each) and another worker takes the lease over: the stalled one's step
    commits nothing (real leases, on this test's PostgreSQL), and leaves it to the other."""
    gpu = node.gpu(0)
    item = relayout.request(gpu, "balanced", actor=admin)
    while MigRelayout.objects.get(pk=item.pk).state != state:
        advance(item)
    real = getattr(relayout, step)
    successors: list[leases.Held | None] = []

    def stalled(*args, **kwargs):
        outcome = real(*args, **kwargs)
        Lease.objects.filter(name=relayout.lease_name(item.pk)).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        successors.append(leases.try_take(relayout.lease_name(item.pk), 60, holder="successor"))
        return outcome

    monkeypatch.setattr(relayout, step, stalled)
    before = steps(item)

    assert advance(item).state == state
    assert successors and successors[0] is not None  # the lease was taken over
    gpu.refresh_from_db()
    assert (MigRelayout.objects.get(pk=item.pk).state, gpu.state) == (state, GpuState.DRAINING)
    assert steps(item) == before  # no step audited
    leases.renew(successors[0])  # still the successor's

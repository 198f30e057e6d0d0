"""The pages, the admin's state-changing actions and edits, and the CLI's writing verbs each
leave exactly the audit rows of their changes, with the person (or ``cli``) who acted and the
request's id. ``PAGES`` is checked against the URLconf: a page route accepting POST added
without an entry fails ``test_every_page_write_has_an_entry``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from gpuadmin import cli
from gpuadmin.access.models import Membership, Role, UnixAccount
from gpuadmin.access.nodes import create_credential
from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from health.alerts import open_alert
from health.models import Alert, AlertRule, BreakerTrip, RecoveryPolicy
from integrations.ray import services as ray_services
from integrations.ray.models import RayCluster, RayJob
from integrations.slurm import services as slurm_services
from integrations.slurm.models import SlurmCluster
from inventory.models import Gpu, Node
from inventory.services import destroy_mig_instance
from scheduling.models import PoolPolicy
from scheduling.sharing import relayout
from tests.gpuadmin import test_audit_every_write as api_writes
from tests.gpuadmin import test_permission_matrix as matrix
from tests.gpuadmin.test_audit_every_write import World
from tests.inventory import conftest as inventory_fixtures
from tests.inventory.conftest import SimNode

pytestmark = pytest.mark.django_db
world = api_writes.world  # the API table's people and fleet
node = inventory_fixtures.node  # a simulated DGX A100 whose agent answers in-process

# Page routes that accept POST but change nothing the audit log covers: signing in and out, and
# a person's own password (Django's auth views).
NOT_AUDITED = {
    "login",
    "logout",
    "password_change",
    "password_reset",
    "password_reset_confirm",
    # The assistant's question form and stream read only; each tool call they make is audited
    # (tests/assistant/ and test_audit_every_write.py's assistant-ask).
    "assistant:page",
    "assistant:stream",
}
HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}


def allowed_methods(view: Callable[..., Any]) -> set[str]:
    """The methods a Django view accepts: its class's handlers, else the list of the
    ``require_http_methods`` family found among its decorators (all methods without one)."""
    view_class = getattr(view, "view_class", None)
    if view_class is not None:
        names = set(view_class.http_method_names)
        return {name.upper() for name in names if hasattr(view_class, name)}
    function: Any = view
    while function is not None:
        for cell in function.__closure__ or ():
            value = cell.cell_contents
            if isinstance(value, list | tuple | set) and value and set(value) <= HTTP_METHODS:
                return set(value)
        function = getattr(function, "__wrapped__", None)
    return HTTP_METHODS


def page_writes() -> set[str]:
    """The names of the page routes (neither the API nor the admin) that accept POST."""
    found: set[str] = set()

    def walk(patterns: list[Any], namespace: str, prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if route.startswith("admin/"):
                    continue  # the admin's writes: ADMIN below
                inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
                walk(pattern.url_patterns, inner, route)
                continue
            assert isinstance(pattern, URLPattern)
            if hasattr(pattern.callback, "cls"):  # DRF: test_audit_every_write.py
                continue
            if "POST" in allowed_methods(pattern.callback):
                found.add(f"{namespace}{pattern.name}")

    walk(get_resolver().url_patterns, "", "")
    return found


@dataclass
class Write:
    """One write through a page or the admin: who sends it, where, with what, and the audit
    rows it must leave (one per change)."""

    actor: User
    url: str
    events: list[str]
    data: dict[str, Any] = field(default_factory=dict)


def mig(request: pytest.FixtureRequest) -> SimNode:
    """A simulated DGX A100 whose agent answers in-process (after ``world``'s broker)."""
    return request.getfixturevalue("node")


def room_on_gpu0(w: World, request: pytest.FixtureRequest) -> Gpu:
    """GPU 0 with its 3g.20gb instance destroyed (its memory slices 4-7 free)."""
    gpu = mig(request).gpu(0)
    destroy_mig_instance(gpu, 2, actor=w.root)
    return gpu


PAGES: dict[str, Callable[[World, pytest.FixtureRequest], Write]] = {
    "scheduling:job-new": lambda w, r: Write(
        w.alice,
        "/jobs/new/",
        ["job.submitted"],
        {
            "command": "sleep 60",
            "gpu_count": 1,
            "node_count": 1,
            "topology": "any",
            "priority": "normal",
            "max_retries": 0,
        },
    ),
    "scheduling:job-cancel": lambda w, r: Write(
        w.alice, f"/jobs/{w.job().pk}/cancel/", ["job.canceled"]
    ),
    "scheduling:job-release": lambda w, r: Write(
        w.alice, f"/jobs/{w.job(hold=True).pk}/release/", ["job.queued"]
    ),
    # The Ray pages (a cluster where nothing listens: Ray hears of nothing, gpuadmin audits).
    "ray:job-new": lambda w, r: Write(
        w.alice,
        "/ray/jobs/new/",
        ["ray_job.submitted"],
        {"cluster": ray_cluster().name, "entrypoint": "true", "gpus": "0", "cpus": "0"},
    ),
    "ray:job-cancel": lambda w, r: Write(
        w.alice,
        f"/ray/jobs/{ray_job(w).pk}/cancel/",
        ["ray_job.cancel_requested"],
    ),
    "scheduling:array-cancel": lambda w, r: Write(
        w.alice,
        f"/arrays/{w.array().pk}/cancel/",
        # the task not made a job yet, then each of its two jobs, waiting
        ["array.canceled", "job.canceled", "job.canceled"],
    ),
    # One row: not discovery's view of the same change from the agent's fresh scan too.
    "inventory:mig-create": lambda w, r: Write(
        w.root,
        f"/gpus/{room_on_gpu0(w, r).uuid}/mig/create/",
        ["gpu.mig_instance_created"],
        {"profile_name": "3g.20gb", "placement_start": 4},
    ),
    "inventory:mig-destroy": lambda w, r: Write(
        w.root,
        f"/gpus/{mig(r).gpu(0).uuid}/mig/2/destroy/",
        ["gpu.mig_instance_destroyed"],
    ),
    "inventory:gpu-state": lambda w, r: Write(
        w.ops,
        f"/gpus/{w.gpu().uuid}/state/",
        ["gpu.state_changed"],
        {"state": "offline", "reason": "fan"},
    ),
    "inventory:node-state": lambda w, r: Write(
        w.ops, "/nodes/dgx-02/state/", ["node.state_changed"], {"state": "draining", "reason": "x"}
    ),
    "reservations:list": lambda w, r: Write(
        w.alice,
        "/reservations/",
        ["reservation.requested", "reservation.approved"],  # auto-approved within quota
        {
            "gpu_count": 1,
            "start": f"{timezone.localtime() + timedelta(days=2):%Y-%m-%dT%H:%M}",
            "end": f"{timezone.localtime() + timedelta(days=2, hours=1):%Y-%m-%dT%H:%M}",
        },
    ),
    "reservations:approve": lambda w, r: Write(
        w.root,
        f"/reservations/{api_writes.booked(w, waiting=True).pk}/approve/",
        ["reservation.approved"],
    ),
    "reservations:reject": lambda w, r: Write(
        w.root,
        f"/reservations/{api_writes.booked(w, waiting=True).pk}/reject/",
        ["reservation.rejected"],
        {"reason": "not now"},
    ),
    "reservations:cancel": lambda w, r: Write(
        w.alice, f"/reservations/{api_writes.booked(w).pk}/cancel/", ["reservation.canceled"]
    ),
    "reservations:release": lambda w, r: Write(
        w.alice,
        f"/reservations/{api_writes.booked(w, started=True).pk}/release/",
        ["reservation.released"],
    ),
    "relayout:request": lambda w, r: Write(
        w.root,
        f"/gpus/{mig(r).gpu(0).uuid}/mig-relayout/new/",
        ["gpu.state_changed", "mig_relayout.draining"],
        {"layout_name": "balanced"},
    ),
    "relayout:cancel": lambda w, r: Write(
        w.root,
        f"/mig-relayouts/{relayout.request(mig(r).gpu(0), 'balanced', actor=w.root).pk}/cancel/",
        ["gpu.state_changed", "mig_relayout.canceled"],
    ),
    "policies:edit": lambda w, r: Write(
        w.root, "/policies/~/", ["scheduler.policy_changed"], matrix.POLICY_FORM
    ),
    "policies:quota-new": lambda w, r: Write(
        w.root, "/quotas/new/", ["quota.created"], matrix.QUOTA_FORM
    ),
    "policies:quota-edit": lambda w, r: Write(
        w.root,
        f"/quotas/{w.quota().pk}/",
        ["quota.changed"],
        {**matrix.QUOTA_FORM, "max_gpus": "2"},
    ),
    "policies:quota-delete": lambda w, r: Write(
        w.root, f"/quotas/{w.quota().pk}/delete/", ["quota.deleted"]
    ),
    "health:alert-ack": lambda w, r: Write(
        w.ops, f"/alerts/{firing_alert().pk}/ack/", ["alert.acknowledged"], {"comment": "seen"}
    ),
}


def firing_alert() -> Alert:
    return open_alert(fingerprint=f"audit-{uuid.uuid4().hex[:6]}", severity="warning", summary="x")


def action(name: str, *pks: object) -> dict[str, Any]:
    return {"action": name, "_selected_action": [str(pk) for pk in pks], "index": "0"}


def change_form(w: World, url: str, **changes: Any) -> dict[str, Any]:
    """What the admin's change form at ``url`` posts: its current values (and its inlines'),
    with ``changes``."""
    client = Client()
    client.force_login(w.root)
    context = client.get(url).context
    data: dict[str, Any] = {}
    forms = [context["adminform"].form]
    for inline in context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.forms]
    for form in forms:
        for bound in form:
            value = bound.value()
            if value is not None and not (bound.field.disabled or bound.name in ("DELETE",)):
                data[bound.html_name] = value
    return {**data, **changes}


def membership(w: World) -> Write:
    row = Membership.objects.get(user=w.ops)
    url = f"/admin/access/membership/{row.pk}/change/"
    return Write(
        w.root,
        url,
        ["membership.role_changed"],
        {"user": w.ops.pk, "role": Role.ADMIN},
    )


def unix_account(w: World) -> Write:
    account = UnixAccount.objects.create(user=w.alice, username="alice")
    return Write(
        w.root,
        f"/admin/access/unixaccount/{account.pk}/change/",
        ["unix_account.changed"],
        {"username": "alice2"},
    )


def ray_cluster() -> RayCluster:
    return RayCluster.objects.create(name="lab", address="http://127.0.0.1:9")


def ray_job(w: World) -> RayJob:
    """Alice's Ray job, stored (its send waits for the commit, which a test never makes)."""
    return ray_services.submit(owner=w.alice, cluster=ray_cluster(), entrypoint="true")


def slurm_cluster(w: World) -> SlurmCluster:
    cluster = SlurmCluster(name="hpc", url="http://slurm:6820", user_name="gpuadmin", token="t")
    return slurm_services.save_cluster(cluster, actor=w.root)


SLURM_CLUSTER_FORM = {
    "name": "lab",
    "url": "http://slurm.lab:6820",
    "auth": "jwt",
    "user_name": "gpuadmin",
    "token": "jwt",
    "poll_interval_s": "30",
}


ADMIN: dict[str, Callable[[World], Write]] = {
    "job cancel action": lambda w: Write(
        w.root,
        "/admin/scheduling/job/",
        ["job.canceled"],
        action("cancel_jobs", w.job().pk),
    ),
    "token revoke action": lambda w: Write(
        w.root,
        "/admin/access/apitoken/",
        ["token.revoked"],
        action("revoke_tokens", create_token(w.alice, "old")[0].pk),
    ),
    "node credential revoke action": lambda w: Write(
        w.root,
        "/admin/access/nodecredential/",
        ["node_credential.revoked"],
        action(
            "revoke_credentials",
            create_credential("dgx-01", actor_name="tests")[0].pk,
        ),
    ),
    "membership role change": membership,
    "unix account change": unix_account,
    "gpu catalog edit": lambda w: Write(
        w.root,
        url := f"/admin/inventory/gpu/{w.gpu().pk}/change/",
        ["gpu.catalog_changed"],
        change_form(w, url, label="left", notes="fan noisy"),
    ),
    "gpu drain action": lambda w: Write(
        w.root,
        "/admin/inventory/gpu/",
        ["gpu.state_changed"],
        action("set_draining", w.gpu().pk) | {"apply": "1", "reason": "firmware"},
    ),
    "node offline action": lambda w: Write(
        w.root,
        "/admin/inventory/node/",
        ["node.state_changed"],
        action("set_offline", Node.objects.get(hostname="dgx-02").pk)
        | {"apply": "1", "reason": "rack"},
    ),
    "quarantine release action": lambda w: Write(
        w.root,
        "/admin/health/quarantine/",
        ["gpu.state_changed", "gpu.quarantine_changed"],
        action("release_quarantines", w.quarantine().pk) | {"apply": "1", "reason": "ok"},
    ),
    "breaker reset action": lambda w: Write(
        w.root,
        "/admin/health/breakertrip/",
        ["health.breaker_reset"],
        action("reset_breaker", BreakerTrip.objects.create(falling=4, fleet=16).pk)
        | {"apply": "1", "reason": "fixed"},
    ),
    "reservation approve action": lambda w: Write(
        w.root,
        "/admin/scheduling/reservation/",
        ["reservation.approved"],
        action("approve_reservations", api_writes.booked(w, waiting=True).pk),
    ),
    "reservation reject action": lambda w: Write(
        w.root,
        "/admin/scheduling/reservation/",
        ["reservation.rejected"],
        action("reject_reservations", api_writes.booked(w, waiting=True).pk)
        | {"apply": "1", "reason": "no"},
    ),
    "reservation cancel action": lambda w: Write(
        w.root,
        "/admin/scheduling/reservation/",
        ["reservation.canceled"],
        action("cancel_reservations", api_writes.booked(w).pk) | {"apply": "1", "reason": "no"},
    ),
    "alert acknowledge action": lambda w: Write(
        w.root,
        "/admin/health/alert/",
        ["alert.acknowledged"],
        action("acknowledge", firing_alert().pk),
    ),
    "alert rule edit": lambda w: Write(
        w.root,
        url := f"/admin/health/alertrule/{AlertRule.objects.get(kind='metric').pk}/change/",
        ["alert_rule.changed"],
        change_form(w, url, threshold=88),
    ),
    "recovery policy edit": lambda w: Write(
        w.root,
        url := f"/admin/health/recoverypolicy/{RecoveryPolicy.objects.get(xid=13).pk}/change/",
        ["health.policy_changed"],
        change_form(w, url, actions=["alert"]),
    ),
    "pool policy edit": lambda w: Write(
        w.root,
        url := f"/admin/scheduling/poolpolicy/{PoolPolicy.default().pk}/change/",
        ["scheduler.policy_changed"],
        change_form(w, url, policy="sjf", preempt_grace_s=120),
    ),
    "quota add": lambda w: Write(
        w.root,
        "/admin/scheduling/quota/add/",
        ["quota.created"],
        {"project": "vision", "max_gpus": "8", "period": "month", "fairshare_weight": "2"},
    ),
    "quota edit": lambda w: Write(
        w.root,
        url := f"/admin/scheduling/quota/{w.quota().pk}/change/",
        ["quota.changed"],
        change_form(w, url, gpu_hours=500),
    ),
    "quota delete": lambda w: Write(
        w.root,
        f"/admin/scheduling/quota/{w.quota().pk}/delete/",
        ["quota.deleted"],
        {"post": "yes"},
    ),
    "slurm cluster add": lambda w: Write(
        w.root, "/admin/slurm/slurmcluster/add/", ["slurm.cluster_registered"], SLURM_CLUSTER_FORM
    ),
    "slurm cluster edit": lambda w: Write(
        w.root,
        url := f"/admin/slurm/slurmcluster/{slurm_cluster(w).pk}/change/",
        ["slurm.cluster_changed"],
        change_form(w, url, drain_fenced=True),
    ),
    "slurm cluster delete": lambda w: Write(
        w.root,
        f"/admin/slurm/slurmcluster/{slurm_cluster(w).pk}/delete/",
        ["slurm.cluster_deleted"],
        {"post": "yes"},
    ),
    "node catalog edit": lambda w: Write(
        w.root,
        url := f"/admin/inventory/node/{Node.objects.get(hostname='dgx-01').pk}/change/",
        ["node.catalog_changed"],
        change_form(w, url, notes="rack 4"),
    ),
}


def test_every_page_write_has_an_entry():
    """A new page that accepts POST needs a row in ``PAGES`` (or a reason in NOT_AUDITED)."""
    assert page_writes() == set(PAGES) | NOT_AUDITED


def send(write: Write) -> tuple[uuid.UUID, list[AuditEvent]]:
    """Post ``write`` as its actor under a fresh request id; the id and the rows it left."""
    seen = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    client = Client()
    client.force_login(write.actor)
    sent = uuid.uuid4()
    response = client.post(write.url, write.data, HTTP_X_REQUEST_ID=str(sent))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert response["X-Request-ID"] == str(sent)
    return sent, list(AuditEvent.objects.filter(pk__gt=seen).order_by("pk"))


def assert_rows(rows: list[AuditEvent], events: list[str], actor: User, sent: uuid.UUID) -> None:
    assert sorted(row.event_type for row in rows) == sorted(events)
    assert {(row.actor_id, row.actor_name) for row in rows} == {(actor.pk, actor.get_username())}
    assert {row.request_id for row in rows} == {sent}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_page_write_leaves_one_audit_row_per_change(world, request, page):
    write = PAGES[page](world, request)
    sent, rows = send(write)
    assert_rows(rows, write.events, write.actor, sent)


@pytest.mark.parametrize("what", sorted(ADMIN))
def test_an_admin_write_leaves_one_audit_row_per_change(world, what):
    User.objects.filter(pk=world.root.pk).update(is_superuser=True)  # every model's admin
    write = ADMIN[what](world)
    sent, rows = send(write)
    assert_rows(rows, write.events, write.actor, sent)


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> list[AuditEvent]:
    """Run a verb in this process; the audit rows it left."""
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)  # pytest-django set it up
    seen = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    assert cli.main(list(argv)) == 0
    return list(AuditEvent.objects.filter(pk__gt=seen).order_by("pk"))


@pytest.mark.parametrize(
    ("argv", "events"),
    [
        (("token", "create", "laptop", "--user", "alice"), ["token.created"]),
        (("node", "credential", "create", "dgx-09"), ["node_credential.created"]),
        (
            ("node", "credential", "revoke", "dgx-01"),  # both of its credentials
            ["node_credential.revoked", "node_credential.revoked"],
        ),
    ],
    ids=lambda value: " ".join(value[:3]) if isinstance(value, tuple) else None,
)
def test_a_cli_verb_leaves_its_rows_under_one_request_id(world, monkeypatch, capsys, argv, events):
    create_credential("dgx-01", actor_name="tests")  # its second: one came with the node
    rows = run_cli(monkeypatch, *argv)
    assert [row.event_type for row in rows] == events
    assert {(row.actor_id, row.actor_name) for row in rows} == {(None, cli.CLI_ACTOR)}
    [request_id] = {row.request_id for row in rows}
    assert request_id is not None

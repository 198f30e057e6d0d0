"""Who may do what, as a table: every endpoint and page (the URLconf, walked) x every role x
(the requester's own object, someone else's) -> the status it answers. A route added without
an entry fails ``test_every_route_has_an_entry``.

Roles (docs/reference/api.md, "Who may do what"): anonymous; viewer, user (no role),
operator and admin (``Membership`` roles; the admin is not staff); staff (Django's
``is_staff``: an admin too).
Where no agent could answer (discovery, MIG changes) the decision still shows: 403 for those
refused, the agent's 503 or the page's own answer for those let through.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.urls import URLPattern
from django.utils import timezone

from gpuadmin.access.models import Membership, Role
from gpuadmin.access.services import create_token
from gpuadmin.audit.models import AuditEvent
from health import quarantine
from health.alerts import open_alert
from health.models import HealthEvent, Quarantine
from inventory import services as inventory_services
from inventory.models import Gpu
from scheduling.allocations import manual
from scheduling.jobs import submission
from scheduling.models import Quota
from scheduling.reservations import services as reservations
from tests.gpuadmin.urlconf import ADMIN_PREFIX, routes
from tests.scheduling.api.conftest import agent_broker  # noqa: F401 - a fixture
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "viewer", "user", "operator", "admin", "staff")
LOGIN = "login"  # a redirect to the sign-in page
# Each role's expectation: a status, LOGIN, or (own object, someone else's) for a path or body
# naming an object. Anonymous people own nothing: theirs is always about someone else's.
Expected = int | str | tuple[int | str, int | str]


def by_role(*codes: Expected) -> dict[str, Expected]:
    """Statuses in ``ROLES`` order; staff answer as admins when left out."""
    return dict(zip(ROLES, codes if len(codes) == 6 else (*codes, codes[-1]), strict=True))


API_READ = by_role(401, 200, 200, 200, 200)
PAGE_READ = by_role(LOGIN, 200, 200, 200, 200)
PUBLIC = by_role(200, 200, 200, 200, 200)
OPERATORS = by_role(401, 403, 403, 200, 200)
ADMINS = by_role(401, 403, 403, 403, 200)
# A job (or its allocation) anyone signed in reads but a user only their own.
SEE_JOB = by_role(401, (200, 200), (200, 404), (200, 200), (200, 200))
# What a job keeps private (its log): its owner and admins (GPUADMIN_PRIVATE_DATA's default).
READ_PRIVATE = by_role(401, (200, 403), (200, 404), (200, 403), (200, 200))
# Acting on a job: its owner (not a viewer), operators and admins; a user does not see others'.
ACT_ON_JOB = by_role(401, (403, 403), (200, 404), (200, 200), (200, 200))
# Acting on a reservation: as on a job, but everyone signed in sees everyone's reservations.
ACT_ON_RESERVATION = by_role(401, (403, 403), (200, 403), (200, 200), (200, 200))
# Deciding on one: admins.
DECIDE_RESERVATION = by_role(401, 403, 403, 403, 200)
# A reservation window two days ahead (each role's own reservation is one day ahead; the
# admins' decisions are on someone's request three hours after it).
HOUR = timedelta(hours=1)
BOOKED = timezone.now().replace(second=0, microsecond=0) + timedelta(days=2)


# The policies page's form, as a browser posts it (unchecked boxes are left out).
POLICY_FORM = {
    "policy": "fairshare",
    "backfill": "on",
    "aging_interval_s": "60",
    "fairshare_half_life_s": "3600",
    "fairshare_weight": "100",
    "las_thresholds_gpu_s": "",
    "qssf_points_per_halving": "250",
    "prediction_trust_intervals": "360",
    "allow_borrowing": "on",
    "preempt_exempt_s": "0",
    "las_min_run_s": "600",
    "preempt_signal": "SIGTERM",
    "preempt_grace_s": "30",
    "reservation_release_after_s": "900",
}

# The quotas page's form, as a browser posts it (no pool: the GPUs in no pool).
QUOTA_FORM = {"project": "vision", "max_gpus": "8", "period": "month", "fairshare_weight": "2"}


@dataclass(frozen=True)
class Entry:
    """A request; ``path`` and ``body`` name objects as ``{job}`` (a held job), ``{placed}`` (a
    job holding a GPU), ``{allocation}``, ``{token}``, ``{event}``, ``{node}``, ``{gpu}``,
    ``{free_gpu}``, ``{queued}`` (someone's queued job), ``{alert}`` (a firing alert),
    ``{quarantine}`` (an open one), ``{quota}`` (the requester's own quota),
    ``{reservation}`` (the requester's own, approved, not started), ``{requested}``
    (someone's reservation waiting for an admin), ``{array}`` (the requester's held job
    array), ``{queued_array}`` (the requester's job array, not held, waiting for ``{job}``),
    ``{queued_job}`` (the requester's queued job, waiting for ``{job}``)."""

    path: str
    expect: dict[str, Expected]
    body: dict[str, Any] | None = None
    form: bool = False  # a page's form post rather than JSON


# (route as walked, method) -> Entry
TABLE: dict[tuple[str, str], Entry] = {
    # Project pages and health
    ("", "GET"): Entry("/", PUBLIC),
    ("-/health", "GET"): Entry("/-/health", PUBLIC),
    # To the site's icon under static/ (browsers ask for it whatever a page links).
    ("favicon.ico", "GET"): Entry("/favicon.ico", by_role(302, 302, 302, 302, 302)),
    # Prometheus scrapes it (GPUADMIN_METRICS_TOKEN, when set, guards it: tests/health/)
    ("metrics", "GET"): Entry("/metrics", PUBLIC),
    # Its parts, for Prometheus's HTTP service discovery (guarded the same way; no such node:
    # a 404, whoever asks)
    ("metrics/fleet", "GET"): Entry("/metrics/fleet", PUBLIC),
    ("metrics/targets", "GET"): Entry("/metrics/targets", PUBLIC),
    ("metrics/nodes/<str:hostname>", "GET"): Entry(
        "/metrics/nodes/no-such-node", by_role(404, 404, 404, 404, 404)
    ),
    ("api/schema/", "GET"): Entry("/api/schema/", PUBLIC),
    ("api/docs/", "GET"): Entry("/api/docs/", PUBLIC),
    # The documentation site is not built for the tests: its pages are the 404 saying how.
    ("docs/", "GET"): Entry("/docs/", by_role(404, 404, 404, 404, 404)),
    ("docs/<path:page>", "GET"): Entry("/docs/reference/", by_role(404, 404, 404, 404, 404)),
    ("admin/", "GET"): Entry("/admin/", by_role(302, 302, 302, 302, 302, 200)),
    ("audit/", "GET"): Entry("/audit/", by_role(LOGIN, 403, 403, 200, 200)),
    # Django's sign-in views
    ("accounts/login/", "GET"): Entry("/accounts/login/", PUBLIC),
    ("accounts/logout/", "POST"): Entry(
        "/accounts/logout/", by_role(302, 302, 302, 302, 302), form=True
    ),
    ("accounts/password_change/", "GET"): Entry("/accounts/password_change/", PAGE_READ),
    ("accounts/password_change/done/", "GET"): Entry("/accounts/password_change/done/", PAGE_READ),
    ("accounts/password_reset/", "GET"): Entry("/accounts/password_reset/", PUBLIC),
    ("accounts/password_reset/done/", "GET"): Entry("/accounts/password_reset/done/", PUBLIC),
    ("accounts/reset/<uidb64>/<token>/", "GET"): Entry("/accounts/reset/MQ/x-y/", PUBLIC),
    ("accounts/reset/done/", "GET"): Entry("/accounts/reset/done/", PUBLIC),
    # Inventory pages: readable without signing in; MIG changes for admins
    ("fleet/", "GET"): Entry("/fleet/", PUBLIC),
    ("gpus/<str:uuid>/", "GET"): Entry("/gpus/{gpu}/", PUBLIC),
    ("gpus/<str:uuid>/mig/create/", "POST"): Entry(
        "/gpus/{gpu}/mig/create/",
        by_role(LOGIN, 403, 403, 403, 302),
        {"profile_name": "1g.10gb"},
        form=True,
    ),
    ("gpus/<str:uuid>/mig/<int:gi_id>/destroy/", "POST"): Entry(
        "/gpus/{gpu}/mig/1/destroy/", by_role(LOGIN, 403, 403, 403, 302), form=True
    ),
    ("nodes/<str:hostname>/", "GET"): Entry("/nodes/{node}/", PUBLIC),
    ("nodes/<str:hostname>/mig/", "GET"): Entry("/nodes/{node}/mig/", PUBLIC),
    ("nodes/<str:hostname>/topology/", "GET"): Entry("/nodes/{node}/topology/", PUBLIC),
    # Telemetry history for the charts: as public as the pages that draw them
    ("api/v1/gpus/<str:uuid>/history/", "GET"): Entry("/api/v1/gpus/{gpu}/history/", PUBLIC),
    ("api/v1/nodes/<str:hostname>/history/", "GET"): Entry(
        "/api/v1/nodes/{node}/history/?range=24h", PUBLIC
    ),
    ("api/v1/fleet/history/", "GET"): Entry("/api/v1/fleet/history/?range=7d", PUBLIC),
    # Inventory API: everyone signed in reads; catalog edits and discovery for admins
    ("api/v1/", "GET"): Entry("/api/v1/", API_READ),
    ("api/v1/^nodes/$", "GET"): Entry("/api/v1/nodes/", API_READ),
    ("api/v1/^nodes/(?P<hostname>[^/]+)/$", "GET"): Entry("/api/v1/nodes/{node}/", API_READ),
    ("api/v1/^nodes/(?P<hostname>[^/]+)/$", "PATCH"): Entry(
        "/api/v1/nodes/{node}/", ADMINS, {"notes": "patched"}
    ),
    ("api/v1/^nodes/(?P<hostname>[^/]+)/topology/$", "GET"): Entry(
        "/api/v1/nodes/{node}/topology/", API_READ
    ),
    ("api/v1/^gpus/$", "GET"): Entry("/api/v1/gpus/", API_READ),
    ("api/v1/^gpus/(?P<uuid>[^/]+)/$", "GET"): Entry("/api/v1/gpus/{gpu}/", API_READ),
    ("api/v1/^gpus/(?P<uuid>[^/]+)/$", "PATCH"): Entry(
        "/api/v1/gpus/{gpu}/", ADMINS, {"label": "patched"}
    ),
    ("api/v1/^mig-instances/$", "GET"): Entry("/api/v1/mig-instances/", API_READ),
    ("api/v1/fleet/", "GET"): Entry("/api/v1/fleet/", API_READ),
    ("api/v1/health/", "GET"): Entry("/api/v1/health/?node={node}", API_READ),
    # Maintenance (drain, offline, online with a reason): operators and admins
    ("api/v1/^nodes/(?P<hostname>[^/]+)/state/$", "POST"): Entry(
        "/api/v1/nodes/{node}/state/", OPERATORS, {"state": "draining", "reason": "tests"}
    ),
    ("api/v1/^gpus/(?P<uuid>[^/]+)/state/$", "POST"): Entry(
        "/api/v1/gpus/{gpu}/state/", OPERATORS, {"state": "draining", "reason": "tests"}
    ),
    ("gpus/<str:uuid>/state/", "POST"): Entry(
        "/gpus/{gpu}/state/",
        by_role(LOGIN, 403, 403, 302, 302),
        {"state": "draining", "reason": "tests"},
        form=True,
    ),
    ("nodes/<str:hostname>/state/", "POST"): Entry(
        "/nodes/{node}/state/",
        by_role(LOGIN, 403, 403, 302, 302),
        {"state": "draining", "reason": "tests"},
        form=True,
    ),
    # Quarantines: everyone signed in reads, operators release (a GPU back in service); the
    # circuit breaker: admins reset it (409 here: it is not open)
    ("api/v1/^quarantines/$", "GET"): Entry("/api/v1/quarantines/", API_READ),
    ("api/v1/^quarantines/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/quarantines/{quarantine}/", API_READ
    ),
    ("api/v1/^quarantines/(?P<pk>[^/.]+)/release/$", "POST"): Entry(
        "/api/v1/quarantines/{quarantine}/release/", OPERATORS, {"reason": "tests"}
    ),
    ("api/v1/breaker/", "GET"): Entry("/api/v1/breaker/", API_READ),
    ("api/v1/breaker/reset/", "POST"): Entry(
        "/api/v1/breaker/reset/", by_role(401, 403, 403, 403, 409), {"reason": "tests"}
    ),
    ("api/gpu/devices", "GET"): Entry("/api/gpu/devices?node={node}", API_READ),
    ("api/gpu/driver", "GET"): Entry("/api/gpu/driver?node={node}", API_READ),
    ("gpu/mig/summary", "GET"): Entry("/gpu/mig/summary?node={node}", API_READ),
    ("gpu/mig/instances", "GET"): Entry("/gpu/mig/instances?node={node}", API_READ),
    ("gpu/topology", "GET"): Entry("/gpu/topology?node={node}", API_READ),
    ("gpu/discover", "GET"): Entry("/gpu/discover?node={node}", by_role(401, 403, 403, 403, 503)),
    # Alerts: everyone signed in reads; operators and admins acknowledge
    ("alerts/", "GET"): Entry("/alerts/", PAGE_READ),
    ("alerts/idle/", "GET"): Entry("/alerts/idle/", PAGE_READ),
    # Accounting: everyone signed in reads everyone's use (like sreport)
    ("usage/", "GET"): Entry("/usage/", PAGE_READ),
    ("usage.csv", "GET"): Entry("/usage.csv", PAGE_READ),
    ("alerts/panel/", "GET"): Entry("/alerts/panel/", PAGE_READ),
    ("alerts/<int:pk>/ack/", "POST"): Entry(
        "/alerts/{alert}/ack/", by_role(LOGIN, 403, 403, 302, 302), {"comment": "seen"}, form=True
    ),
    ("api/v1/^alerts/$", "GET"): Entry("/api/v1/alerts/", API_READ),
    ("api/v1/^alerts/(?P<pk>[^/.]+)/$", "GET"): Entry("/api/v1/alerts/{alert}/", API_READ),
    ("api/v1/^alerts/(?P<pk>[^/.]+)/ack/$", "POST"): Entry(
        "/api/v1/alerts/{alert}/ack/", OPERATORS, {"comment": "seen"}
    ),
    ("api/v1/^idle-held/$", "GET"): Entry("/api/v1/idle-held/", API_READ),
    # The Slurm mirror: read-only
    ("api/v1/slurm/^clusters/$", "GET"): Entry("/api/v1/slurm/clusters/", API_READ),
    ("api/v1/slurm/^nodes/$", "GET"): Entry("/api/v1/slurm/nodes/", API_READ),
    ("api/v1/slurm/^jobs/$", "GET"): Entry("/api/v1/slurm/jobs/", API_READ),
    # Audit log: operators and admins
    ("api/v1/^audit/$", "GET"): Entry("/api/v1/audit/", OPERATORS),
    ("api/v1/^audit/(?P<pk>[^/.]+)/$", "GET"): Entry("/api/v1/audit/{event}/", OPERATORS),
    # Jobs
    ("api/v1/^jobs/$", "GET"): Entry("/api/v1/jobs/", API_READ),
    ("api/v1/^jobs/$", "POST"): Entry(
        "/api/v1/jobs/", by_role(401, 403, 201, 201, 201), {"command": "true"}
    ),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/$", "GET"): Entry("/api/v1/jobs/{job}/", SEE_JOB),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/cancel/$", "POST"): Entry(
        "/api/v1/jobs/{job}/cancel/", ACT_ON_JOB
    ),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/kill/$", "POST"): Entry("/api/v1/jobs/{job}/kill/", ACT_ON_JOB),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/release/$", "POST"): Entry(
        "/api/v1/jobs/{job}/release/", ACT_ON_JOB
    ),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/hold/$", "POST"): Entry(
        "/api/v1/jobs/{queued_job}/hold/", ACT_ON_JOB
    ),
    ("api/v1/^jobs/(?P<pk>[^/.]+)/log/$", "GET"): Entry("/api/v1/jobs/{placed}/log/", READ_PRIVATE),
    # Job arrays: as their tasks
    ("api/v1/^arrays/$", "GET"): Entry("/api/v1/arrays/", API_READ),
    ("api/v1/^arrays/(?P<pk>[^/.]+)/$", "GET"): Entry("/api/v1/arrays/{array}/", SEE_JOB),
    ("api/v1/^arrays/(?P<pk>[^/.]+)/cancel/$", "POST"): Entry(
        "/api/v1/arrays/{array}/cancel/", ACT_ON_JOB
    ),
    ("api/v1/^arrays/(?P<pk>[^/.]+)/release/$", "POST"): Entry(
        "/api/v1/arrays/{array}/release/", ACT_ON_JOB
    ),
    ("api/v1/^arrays/(?P<pk>[^/.]+)/hold/$", "POST"): Entry(
        "/api/v1/arrays/{queued_array}/hold/", ACT_ON_JOB
    ),
    ("api/v1/^allocations/$", "GET"): Entry("/api/v1/allocations/", API_READ),
    ("api/v1/^allocations/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/allocations/{allocation}/", SEE_JOB
    ),
    ("queue", "GET"): Entry("/queue", API_READ),
    ("queue/submit", "POST"): Entry(
        "/queue/submit", by_role(401, 403, 201, 201, 201), {"command": "true"}
    ),
    ("queue/statistics", "GET"): Entry("/queue/statistics", API_READ),
    ("queue/<int:job_id>", "DELETE"): Entry("/queue/{job}", ACT_ON_JOB),
    ("queue/<int:job_id>/priority", "PATCH"): Entry(
        "/queue/{job}/priority", ACT_ON_JOB, {"priority": "high"}
    ),
    # GPUs by hand: operators; the scheduler's switch and policy: admins
    ("cluster/gpu-status", "GET"): Entry("/cluster/gpu-status", API_READ),
    ("cluster/gpu-allocate", "POST"): Entry(
        "/cluster/gpu-allocate",
        by_role(401, 403, 403, 201, 201),
        {"job_id": "{queued}", "gpu_uuids": ["{free_gpu}"]},
    ),
    ("cluster/gpu-release", "POST"): Entry(
        "/cluster/gpu-release",
        by_role(401, (403, 403), (403, 403), (202, 202), (202, 202)),
        {"job_id": "{placed}"},
    ),
    ("orchestrator/status", "GET"): Entry("/orchestrator/status", API_READ),
    ("orchestrator/start", "POST"): Entry("/orchestrator/start", ADMINS),
    ("orchestrator/stop", "POST"): Entry("/orchestrator/stop", ADMINS),
    ("orchestrator/policies", "GET"): Entry("/orchestrator/policies", API_READ),
    ("orchestrator/policies", "PUT"): Entry(
        "/orchestrator/policies", ADMINS, {"policy": "fcfs", "aging_interval_s": 60}
    ),
    # Pool policies: everyone signed in reads; admins change them (~: the GPUs in no pool)
    ("api/v1/^policies/$", "GET"): Entry("/api/v1/policies/", API_READ),
    ("api/v1/^policies/(?P<pool>[-\\w~]+)/$", "GET"): Entry("/api/v1/policies/~/", API_READ),
    ("api/v1/^policies/(?P<pool>[-\\w~]+)/$", "PATCH"): Entry(
        "/api/v1/policies/~/", ADMINS, {"backfill": False}
    ),
    ("api/v1/^policies/(?P<pool>[-\\w~]+)/$", "PUT"): Entry(
        "/api/v1/policies/~/",
        ADMINS,
        {"policy": "fairshare", "backfill": True, "aging_interval_s": 60}
        | {"fairshare_half_life_s": 3600, "fairshare_weight": 100, "las_thresholds_gpu_s": []}
        | {"allow_borrowing": True, "preemption": True, "preempt_signal": "SIGUSR1"}
        | {"preempt_exempt_s": 600, "preempt_grace_s": 30, "dynamic_mig": False}
        | {"reservation_auto_approve": True}
        | {"reservation_release_after_s": 600},
    ),
    # Quotas: admins write; users read their own (and their projects'), others everyone's
    ("api/v1/^quotas/$", "GET"): Entry("/api/v1/quotas/", API_READ),
    ("api/v1/^quotas/$", "POST"): Entry(
        "/api/v1/quotas/", by_role(401, 403, 403, 403, 201), {"project": "p", "max_gpus": 4}
    ),
    ("api/v1/^quotas/mine/$", "GET"): Entry("/api/v1/quotas/mine/", API_READ),
    ("api/v1/usage/", "GET"): Entry("/api/v1/usage/", API_READ),
    ("api/v1/fairshare/", "GET"): Entry("/api/v1/fairshare/", API_READ),
    ("api/v1/^quotas/(?P<pk>\\d+)/$", "GET"): Entry("/api/v1/quotas/{quota}/", SEE_JOB),
    ("api/v1/^quotas/(?P<pk>\\d+)/$", "PATCH"): Entry(
        "/api/v1/quotas/{quota}/", by_role(401, 403, 403, 403, 200), {"max_gpus": 5}
    ),
    ("api/v1/^quotas/(?P<pk>\\d+)/$", "PUT"): Entry(
        "/api/v1/quotas/{quota}/",
        by_role(401, 403, 403, 403, 200),
        {"project": "p", "max_gpus": 5, "gpu_hours": 100, "period": "week", "fairshare_weight": 2},
    ),
    ("api/v1/^quotas/(?P<pk>\\d+)/$", "DELETE"): Entry(
        "/api/v1/quotas/{quota}/", by_role(401, 403, 403, 403, 204)
    ),
    # Policy pages: everyone signed in reads policies and fair share; admins edit a policy
    ("policies/", "GET"): Entry("/policies/", PAGE_READ),
    ("policies/<str:pool>/", "GET"): Entry("/policies/~/", by_role(LOGIN, 403, 403, 403, 200)),
    ("policies/<str:pool>/", "POST"): Entry(
        "/policies/~/", by_role(LOGIN, 403, 403, 403, 302), POLICY_FORM, form=True
    ),
    # Quota pages: everyone signed in reads (users their own); admins add, change and remove
    ("quotas/", "GET"): Entry("/quotas/", PAGE_READ),
    ("quotas/new/", "GET"): Entry("/quotas/new/", by_role(LOGIN, 403, 403, 403, 200)),
    ("quotas/new/", "POST"): Entry(
        "/quotas/new/", by_role(LOGIN, 403, 403, 403, 302), QUOTA_FORM, form=True
    ),
    ("quotas/<int:pk>/", "GET"): Entry("/quotas/{quota}/", by_role(LOGIN, 403, 403, 403, 200)),
    ("quotas/<int:pk>/", "POST"): Entry(
        "/quotas/{quota}/",
        by_role(LOGIN, 403, 403, 403, 302),
        {**QUOTA_FORM, "project": "vision-edit", "max_gpus": "2"},
        form=True,
    ),
    ("quotas/<int:pk>/delete/", "POST"): Entry(
        "/quotas/{quota}/delete/", by_role(LOGIN, 403, 403, 403, 302), form=True
    ),
    ("fairshare/", "GET"): Entry("/fairshare/", PAGE_READ),
    # API tokens: everyone signed in has their own, and sees no one else's
    ("api/v1/^tokens/$", "GET"): Entry("/api/v1/tokens/", API_READ),
    ("api/v1/^tokens/$", "POST"): Entry(
        "/api/v1/tokens/", by_role(401, 201, 201, 201, 201), {"name": "ci"}
    ),
    ("api/v1/^tokens/(?P<pk>[^/.]+)/$", "DELETE"): Entry(
        "/api/v1/tokens/{token}/", by_role(401, (204, 404), (204, 404), (204, 404), (204, 404))
    ),
    # Job pages: signed in; a user opens only their own jobs
    ("jobs/", "GET"): Entry("/jobs/", PAGE_READ),
    ("jobs/new/", "GET"): Entry("/jobs/new/", by_role(LOGIN, 403, 200, 200, 200)),
    ("jobs/new/", "POST"): Entry(
        "/jobs/new/",
        by_role(LOGIN, 403, 302, 302, 302),
        {"command": "true", "gpu_count": "1", "node_count": "1", "topology": "any"}
        | {"priority": "normal", "max_retries": "0"},
        form=True,
    ),
    ("jobs/<int:pk>/", "GET"): Entry("/jobs/{job}/", {**SEE_JOB, "anonymous": LOGIN}),
    ("jobs/<int:pk>/log/", "GET"): Entry(
        "/jobs/{placed}/log/", {**READ_PRIVATE, "anonymous": LOGIN}
    ),
    ("jobs/<int:pk>/cancel/", "POST"): Entry(
        "/jobs/{job}/cancel/",
        by_role(LOGIN, (403, 403), (302, 404), (302, 302), (302, 302)),
        form=True,
    ),
    ("jobs/<int:pk>/release/", "POST"): Entry(
        "/jobs/{job}/release/",
        by_role(LOGIN, (403, 403), (302, 404), (302, 302), (302, 302)),
        form=True,
    ),
    ("arrays/<int:pk>/cancel/", "POST"): Entry(
        "/arrays/{array}/cancel/",
        by_role(LOGIN, (403, 403), (302, 404), (302, 302), (302, 302)),
        form=True,
    ),
    # Reservations: everyone signed in reads them; users request and act on their own,
    # operators on anyone's; admins decide on requests ({reservation} has not started: a
    # release is refused, 409 / the page's message)
    ("api/v1/^reservations/$", "GET"): Entry("/api/v1/reservations/", API_READ),
    ("api/v1/^reservations/$", "POST"): Entry(
        "/api/v1/reservations/",
        by_role(401, 403, 201, 201, 201),
        {"gpu_count": 1, "start": BOOKED.isoformat(), "end": (BOOKED + HOUR).isoformat()},
    ),
    ("api/v1/^reservations/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/reservations/{reservation}/", API_READ
    ),
    ("api/v1/^reservations/(?P<pk>[^/.]+)/approve/$", "POST"): Entry(
        "/api/v1/reservations/{requested}/approve/", DECIDE_RESERVATION
    ),
    ("api/v1/^reservations/(?P<pk>[^/.]+)/reject/$", "POST"): Entry(
        "/api/v1/reservations/{requested}/reject/", DECIDE_RESERVATION, {"reason": "no"}
    ),
    ("api/v1/^reservations/(?P<pk>[^/.]+)/cancel/$", "POST"): Entry(
        "/api/v1/reservations/{reservation}/cancel/", ACT_ON_RESERVATION
    ),
    ("api/v1/^reservations/(?P<pk>[^/.]+)/release/$", "POST"): Entry(
        "/api/v1/reservations/{reservation}/release/",
        by_role(401, (403, 403), (409, 403), (409, 409), (409, 409)),
    ),
    ("reservations/", "GET"): Entry("/reservations/", PAGE_READ),
    ("reservations/", "POST"): Entry(
        "/reservations/",
        by_role(LOGIN, 403, 302, 302, 302),
        {"gpu_count": "1", "start": f"{BOOKED:%Y-%m-%dT%H:%M}"}
        | {"end": f"{BOOKED + HOUR:%Y-%m-%dT%H:%M}"},
        form=True,
    ),
    ("reservations/<int:pk>/approve/", "POST"): Entry(
        "/reservations/{requested}/approve/", by_role(LOGIN, 403, 403, 403, 302), form=True
    ),
    ("reservations/<int:pk>/reject/", "POST"): Entry(
        "/reservations/{requested}/reject/",
        by_role(LOGIN, 403, 403, 403, 302),
        {"reason": "no"},
        form=True,
    ),
    ("reservations/<int:pk>/cancel/", "POST"): Entry(
        "/reservations/{reservation}/cancel/",
        by_role(LOGIN, (403, 403), (302, 403), (302, 302), (302, 302)),
        form=True,
    ),
    ("reservations/<int:pk>/release/", "POST"): Entry(
        "/reservations/{reservation}/release/",
        by_role(LOGIN, (403, 403), (302, 403), (302, 302), (302, 302)),
        form=True,
    ),
    ("nodes/<str:hostname>/calendar/", "GET"): Entry("/nodes/{node}/calendar/", PAGE_READ),
    ("gpus/<str:uuid>/calendar/", "GET"): Entry("/gpus/{gpu}/calendar/", PAGE_READ),
    # MIG re-layouts: everyone signed in watches a GPU's; admins ask for one and cancel it
    ("gpus/<str:uuid>/mig-relayout/", "GET"): Entry("/gpus/{gpu}/mig-relayout/", PAGE_READ),
    ("gpus/<str:uuid>/mig-relayout/new/", "POST"): Entry(
        "/gpus/{gpu}/mig-relayout/new/",
        by_role(LOGIN, 403, 403, 403, 302),
        {"layout_name": "balanced"},
        form=True,
    ),
    ("mig-relayouts/<int:pk>/cancel/", "POST"): Entry(
        "/mig-relayouts/0/cancel/", by_role(LOGIN, 403, 403, 403, 404), form=True
    ),
    ("api/v1/^mig-relayouts/$", "GET"): Entry("/api/v1/mig-relayouts/", API_READ),
    # Admins get past the permission to the workflow's refusal: that GPU is not in MIG mode.
    ("api/v1/^mig-relayouts/$", "POST"): Entry(
        "/api/v1/mig-relayouts/",
        by_role(401, 403, 403, 403, 400),
        {"gpu": "{gpu}", "layout_name": "balanced"},
    ),
    ("api/v1/^mig-relayouts/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/mig-relayouts/0/", by_role(401, 404, 404, 404, 404)
    ),
    ("api/v1/^mig-relayouts/(?P<pk>[^/.]+)/cancel/$", "POST"): Entry(
        "/api/v1/mig-relayouts/0/cancel/", by_role(401, 403, 403, 403, 404)
    ),
    # External Ray clusters (no cluster registered here: tests/integrations/ray/ has real ones)
    ("api/v1/ray/^clusters/$", "GET"): Entry("/api/v1/ray/clusters/", API_READ),
    ("api/v1/ray/^clusters/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/ray/clusters/0/", by_role(401, 404, 404, 404, 404)
    ),
    ("api/v1/ray/^jobs/$", "GET"): Entry("/api/v1/ray/jobs/", API_READ),
    # Users may submit; there is no cluster of that name.
    ("api/v1/ray/^jobs/$", "POST"): Entry(
        "/api/v1/ray/jobs/",
        by_role(401, 403, 400, 400, 400),
        body={"cluster": "none", "entrypoint": "true"},
    ),
    ("api/v1/ray/^jobs/(?P<pk>[^/.]+)/$", "GET"): Entry(
        "/api/v1/ray/jobs/0/", by_role(401, 404, 404, 404, 404)
    ),
    ("api/v1/ray/^jobs/(?P<pk>[^/.]+)/logs/$", "GET"): Entry(
        "/api/v1/ray/jobs/0/logs/", by_role(401, 404, 404, 404, 404)
    ),
    ("api/v1/ray/^jobs/(?P<pk>[^/.]+)/cancel/$", "POST"): Entry(
        "/api/v1/ray/jobs/0/cancel/", by_role(401, 403, 404, 404, 404)
    ),
    # The Ray pages: signed in; users and up submit (no cluster of that name: the form's
    # error, 200); there is no Ray job 0 (the jobs' rules: tests/integrations/ray/)
    ("ray/", "GET"): Entry("/ray/", PAGE_READ),
    ("ray/jobs/new/", "GET"): Entry("/ray/jobs/new/", by_role(LOGIN, 403, 200, 200, 200)),
    ("ray/jobs/new/", "POST"): Entry(
        "/ray/jobs/new/",
        by_role(LOGIN, 403, 200, 200, 200),
        {"cluster": "none", "entrypoint": "true", "gpus": "0", "cpus": "0"},
        form=True,
    ),
    ("ray/jobs/<int:pk>/", "GET"): Entry("/ray/jobs/0/", by_role(LOGIN, 404, 404, 404, 404)),
    ("ray/jobs/<int:pk>/log/", "GET"): Entry(
        "/ray/jobs/0/log/", by_role(LOGIN, 404, 404, 404, 404)
    ),
    ("ray/jobs/<int:pk>/cancel/", "POST"): Entry(
        "/ray/jobs/0/cancel/", by_role(LOGIN, 404, 404, 404, 404), form=True
    ),
    # The assistant, for everyone signed in; no model is configured here (its tools' own
    # permissions: tests/assistant/).
    ("assistant/", "GET"): Entry("/assistant/", PAGE_READ),
    ("assistant/stream/", "POST"): Entry(
        "/assistant/stream/", by_role(LOGIN, 400, 400, 400, 400), {"question": "hi"}, form=True
    ),
    ("api/v1/assistant/ask/", "POST"): Entry(
        "/api/v1/assistant/ask/", by_role(401, 503, 503, 503, 503), {"question": "hi"}
    ),
}

WRITES_AND_GET = {"get", "post", "put", "patch", "delete"}


def api_methods(pattern: URLPattern) -> set[str] | None:
    """The HTTP methods a DRF view answers (None for a plain Django view)."""
    callback = pattern.callback
    actions = getattr(callback, "actions", None)
    view_class = getattr(callback, "cls", None)
    if view_class is None or not hasattr(view_class, "permission_classes"):
        return None
    # A viewset's ``actions`` gains ``head`` once it has answered a request.
    allowed = set(actions) if actions else {m for m in WRITES_AND_GET if hasattr(view_class, m)}
    return {m.upper() for m in allowed & WRITES_AND_GET if m in view_class.http_method_names}


def test_every_route_has_an_entry():
    walked = routes()
    tabled = {route for route, _ in TABLE} - {ADMIN_PREFIX}
    assert sorted(set(walked) - tabled) == [], "routes without an entry in TABLE"
    assert sorted(tabled - set(walked)) == [], "entries for routes that no longer exist"
    for route, pattern in walked.items():
        methods = api_methods(pattern)
        if methods is not None:
            assert {m for r, m in TABLE if r == route} == methods, route


# --------------------------------------------------------------------------- the world


@dataclass
class Person:
    """A client signed in as someone of a role; the object names of the requests it makes
    about its own objects, and about someone else's."""

    client: Client
    own: dict[str, str]
    other: dict[str, str]


def own_objects(user: Any, gpu: Gpu) -> dict[str, str]:
    """A held job, a job holding ``gpu`` (and its allocation), an API token, a quota, an
    approved reservation, a held job array, and a job array and a job waiting for the held job
    of ``user``."""
    held = submission.submit_job(user, command=["true"], hold=True)
    # Gone (by its maximum runtime) before the reservations' windows, which may hold its GPU.
    placed = submission.submit_job(user, command=["sleep", "60"], gpu_count=1, max_runtime_s=3600)
    (allocation,) = manual.allocate_by_hand(placed, [gpu.uuid], actor=user)
    token, _ = create_token(user, "mine")
    quota = Quota.objects.create(user=user, max_gpus=8)
    day_ahead = BOOKED - timedelta(days=1)
    reservation = reservations.request(user, 1, day_ahead, day_ahead + HOUR)
    ids = {"job": held, "placed": placed, "allocation": allocation, "token": token, "quota": quota}
    ids["reservation"] = reservation
    ids["array"] = submission.submit_array(user, "0-1", command=["true"], hold=True).array
    ids["queued_array"] = submission.submit_array(
        user, "0-1", command=["true"], dependency=f"afterok:{held.pk}"
    ).array
    ids["queued_job"] = submission.submit_job(
        user, command=["true"], dependency=f"afterok:{held.pk}"
    )
    return {name: str(row.pk) for name, row in ids.items()}


def fenced(gpu: Gpu) -> Quarantine:
    """``gpu`` fenced by health for an XID 48: its open quarantine."""
    cause = HealthEvent.objects.create(
        node=gpu.node,
        gpu=gpu,
        kind="xid",
        xid=48,
        severity="critical",
        occurred_at=timezone.now(),
        dedupe_key=f"matrix:{gpu.uuid}",
    )
    assert quarantine.fence(gpu, event=cause, policy=None, to_state="degraded")
    return Quarantine.objects.get(gpu=gpu, closed_at__isnull=True)


@pytest.fixture
def world(agent_broker, monkeypatch, settings) -> dict[str, Person]:  # noqa: F811
    """Two simulated nodes; a person per role and someone else, each owning the objects of
    ``own_objects``. No agent answers a discovery or a MIG change."""
    # The nodes heartbeat once, here, and must stay reachable for the whole table: on a loaded
    # host the table outlasts the default grace (30 s), and then a job's log (503), a manual
    # allocation (409) and a release (200, nothing to ask an agent) answered for the node being
    # unreachable, not for the requester's role.
    settings.GPUADMIN_HEARTBEAT_GRACE_S = 24 * 3600

    def no_agent(hostname: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise inventory_services.AgentTimedOut(f"node {hostname} did not answer (no agent)")

    monkeypatch.setattr(inventory_services, "run_on_node", no_agent)
    nodes = [add_sim_node("dgx-01"), add_sim_node("dgx-02")]
    gpus = iter(Gpu.objects.schedulable().order_by("node__hostname", "index"))
    users = get_user_model().objects
    someone = users.create_user("someone")
    theirs = own_objects(someone, next(gpus))
    shared = {
        "node": nodes[0].hostname,
        "gpu": nodes[0].gpus.get(index=0).uuid,
        "free_gpu": next(gpus).uuid,
        "queued": str(
            submission.submit_job(someone, command=["true"], gpu_count=1, max_runtime_s=3600).pk
        ),
        "event": str(AuditEvent.objects.latest("pk").pk),
        "alert": str(open_alert(fingerprint="matrix", severity="warning", summary="x").pk),
        "quarantine": str(fenced(nodes[1].gpus.get(index=7)).pk),
        # over someone's quota of 8 GPUs: waits for an admin
        "requested": str(reservations.request(someone, 9, BOOKED + 3 * HOUR, BOOKED + 4 * HOUR).pk),
    }
    other = {**theirs, **shared}
    people = {"anonymous": Person(Client(), other, other)}
    for role in ROLES[1:]:
        user = users.create_user(role, is_staff=role == "staff")
        if role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN):
            Membership.objects.create(user=user, role=role)
        client = Client()
        client.force_login(user)
        people[role] = Person(client, {**own_objects(user, next(gpus)), **shared}, other)
    return people


class Rollback(Exception):
    """Undoes one request's writes, so every role meets the same world."""


def fill(value: Any, names: dict[str, str]) -> Any:
    """``value`` with its ``{object}`` names filled in (a whole ``"{job}"`` becomes an id)."""
    if isinstance(value, str):
        filled = value.format(**names)
        return int(filled) if value.startswith("{") and filled.isdigit() else filled
    if isinstance(value, list):
        return [fill(item, names) for item in value]
    if isinstance(value, dict):
        return {key: fill(item, names) for key, item in value.items()}
    return value


def answer(client: Client, method: str, entry: Entry, names: dict[str, str]) -> int | str:
    """The status ``client`` gets (LOGIN for a redirect to sign in); its writes undone."""
    path, body = fill(entry.path, names), fill(entry.body, names)
    if body is None:
        data, content_type = "", "application/octet-stream"
    elif entry.form:
        data, content_type = urlencode(body), "application/x-www-form-urlencoded"
    else:
        data, content_type = json.dumps(body), "application/json"
    cookies = copy.deepcopy(client.cookies)  # signing out replaces the session cookie
    try:
        with transaction.atomic():
            raise Rollback(client.generic(method, path, data, content_type))
    except Rollback as rollback:
        response = rollback.args[0]
    client.cookies = cookies
    if response.status_code == 302 and response["Location"].startswith("/accounts/login/"):
        return LOGIN
    return response.status_code


def test_who_may_do_what(world):
    """One world for the whole table (building it per entry would take a minute)."""
    wrong = []
    for (_, method), entry in TABLE.items():
        for role in ROLES:
            expected = entry.expect[role]
            person = world[role]
            if isinstance(expected, tuple):
                cases = {"own": (expected[0], person.own), "other": (expected[1], person.other)}
            else:  # no object of the requester's in the request
                cases = {"": (expected, person.other)}
            for case, (status, names) in cases.items():
                seen = answer(person.client, method, entry, names)
                if seen != status:
                    wrong.append(f"{method} {entry.path} as {role} {case}: {seen}, not {status}")
    assert not wrong, "\n".join(wrong)

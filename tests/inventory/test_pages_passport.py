"""The GPU page as the GPU's passport: service state and why, live counters, processes (foreign
or a job's), MIG devices and history, NVLink peers and NUMA, health events with their trend,
and every allocation it has had; the node page; and their query counts."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from gpuadmin.audit.services import record
from health.choices import EventKind, Severity
from health.models import HealthEvent, Quarantine
from inventory.models import Gpu
from inventory.nvml.sim import faults
from inventory.services import set_gpu_state
from scheduling.models import Allocation, Job, JobState
from tests.inventory.pages import add_node, unique_host

pytestmark = pytest.mark.django_db


def section(html: str, title_id: str) -> str:
    """The page's ``<section>`` labelled by ``title_id``."""
    found = re.search(rf'<section [^>]*aria-labelledby="{title_id}">.*?</section>', html, re.S)
    assert found, f"no section {title_id}"
    return found[0]


def allocate(gpu: Gpu, username: str, *, released: bool, days_ago: int = 0) -> Allocation:
    """A job of ``username`` given ``gpu`` (released, or holding it now)."""
    owner, _ = get_user_model().objects.get_or_create(username=username)
    state = JobState.COMPLETED if released else JobState.RUNNING
    job = Job.objects.create(owner=owner, command=["train.py"], state=state, project="vision")
    at = timezone.now() - timedelta(days=days_ago)
    return Allocation.objects.create(
        job=job,
        gpu=gpu,
        node=gpu.node,
        attempt=1,
        allocated_at=at,
        released_at=at + timedelta(hours=1) if released else None,
    )


def health_event(gpu: Gpu, kind: str, *, xid: int | None = None, days_ago: int = 0) -> HealthEvent:
    at = timezone.now() - timedelta(days=days_ago)
    return HealthEvent.objects.create(
        node=gpu.node,
        gpu=gpu,
        kind=kind,
        xid=xid,
        severity=Severity.CRITICAL,
        message=f"{kind} {xid or ''} on GPU{gpu.index}",
        occurred_at=at,
        dedupe_key=f"{gpu.uuid}:{kind}:{xid}:{at.timestamp()}",
        outcome=["fenced: degraded"],
    )


def test_the_service_state_shows_with_its_reason_and_since(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=3)
    set_gpu_state(gpu, "degraded", actor_name="health", reason="XID 48: double-bit ECC error")

    html = client.get(f"/gpus/{gpu.uuid}/").content.decode()

    state = re.search(r'<dd class="service-state"[^>]*>(.*?)</dd>', html, re.S)[1]
    assert '<span class="badge badge-red">Degraded</span>' in state
    assert f"since {timezone.localtime(gpu.state_changed_at):%Y-%m-%d %H:%M:%S}" in state
    assert state.endswith(": XID 48: double-bit ECC error")
    assert 'title="XID 48: double-bit ECC error">Degraded</span>' in html  # the head's badge


def test_a_process_outside_any_allocation_is_marked_foreign(client):
    host = unique_host()
    add_node(host, busy={4: 55})
    gpu = Gpu.objects.get(node__hostname=host, index=4)

    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()

    processes = re.search(r'<table class="gpu-processes">.*?</table>', live, re.S)[0]
    assert re.search(
        r'<tr class="foreign"><td>4004</td><td>30000</td><td><span [^>]*>foreign<', processes
    )
    assert '<dd class="status-foreign">foreign' in live


def test_the_process_of_the_job_holding_the_gpu_names_the_job(client):
    host = unique_host()
    add_node(host, busy={4: 55})
    gpu = Gpu.objects.get(node__hostname=host, index=4)
    allocation = allocate(gpu, "alice", released=False)

    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()

    job = allocation.job_id
    owned = f'<td><a href="/jobs/{job}/">job #{job}</a> (alice)'
    assert f'<tr class="owned"><td>4004</td><td>30000</td>{owned}' in live
    assert "foreign" not in live


def test_a_mig_gpu_shows_memory_per_mig_device_and_no_utilization(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=0)  # MIG mode, 3 instances
    assert gpu.mig_enabled

    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()

    utilization = re.search(r'<dd class="utilization">(.*?)</dd>', live, re.S)[1]
    assert "utilization is not measurable in MIG mode" in utilization
    assert "0%" not in utilization
    devices = re.search(r'<table class="mig-devices">.*?</table>', live, re.S)[0]
    rows = re.findall(r"<tr><td>(\d+) / (\d+)</td><td>([^<]+)</td><td>(\d+) / (\d+)</td>", devices)
    assert len(rows) == 3
    assert all(int(total) > 0 and int(used) <= int(total) for *_, used, total in rows)
    assert devices.count("not measurable") == 3


def test_a_whole_gpu_shows_its_utilization(client):
    host = unique_host()
    add_node(host, busy={4: 55})
    gpu = Gpu.objects.get(node__hostname=host, index=4)
    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'<dd class="utilization">55%</dd>', live)
    assert "mig-devices" not in live


def test_ecc_retired_pages_and_remapped_rows_show_their_current_values(client):
    host = unique_host()
    add_node(
        host,
        prepare=lambda nvml: faults.set_ecc(nvml, None, 2, count=7, error="corrected"),
    )
    gpu = Gpu.objects.get(node__hostname=host, index=2)

    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()

    counters = dict(re.findall(r'<dt>([^<]+)</dt><dd class="counter">([^<]+)</dd>', live))
    assert counters["ECC errors, volatile (corrected / uncorrected)"] == "7 / 0"
    assert counters["ECC errors, aggregate (corrected / uncorrected)"] == "7 / 0"
    assert "Remapped rows (correctable / uncorrectable / pending / failure)" in counters


def test_a_hot_gpu_is_marked_hot_on_its_page_and_on_the_dashboard(client):
    host = unique_host()
    add_node(host, prepare=lambda nvml: faults.set_temperature(nvml, None, 5, 97))
    gpu = Gpu.objects.get(node__hostname=host, index=5)

    live = client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true").content.decode()
    fleet = client.get(f"/fleet/?node={host}").content.decode()

    assert ">hot</span>" in re.search(r"<dt>Status</dt><dd[^>]*>(.*?)</dd>", live, re.S)[1]
    assert re.search(r'data-count="hot">1<', fleet)
    assert (
        len(re.findall(r'<tr class="s-\w+"><td>\w+[^<]*<span class="badge badge-amber"', fleet))
        == 1
    )


def test_mig_history_lists_the_gpus_mig_changes_from_the_audit_log(client, admin_client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=0)
    record(
        "gpu.facts_changed",
        actor_name="discovery",
        target=gpu,
        target_id=gpu.uuid,
        before={"mig_enabled": False},
        after={"mig_enabled": True},
    )
    record(
        "gpu.mig_changed",
        actor_name="discovery",
        target=gpu,
        target_id=gpu.uuid,
        before={"instances": []},
        after={"instances": ["GI1 3g.20gb", "GI2 2g.10gb"]},
    )
    record(
        "gpu.mig_instance_destroyed",
        actor_name="ada",
        target=gpu,
        target_id=gpu.uuid,
        message="destroyed 2g.10gb GPU instance 2",
    )
    record("gpu.facts_changed", actor_name="discovery", target=gpu, target_id=gpu.uuid,
           before={"vbios_version": "a"}, after={"vbios_version": "b"})  # fmt: skip

    history = section(client.get(f"/gpus/{gpu.uuid}/").content.decode(), "mig-history-title")
    as_admin = section(admin_client.get(f"/gpus/{gpu.uuid}/").content.decode(), "mig-history-title")

    changes = re.findall(r"<td>([^<]*)</td></tr>", history)
    assert changes == [
        "destroyed 2g.10gb GPU instance 2",
        "instances: none \u2192 GI1 3g.20gb, GI2 2g.10gb",
        "MIG mode enabled",
    ]
    assert "<th>Who</th>" not in history and "<td>ada</td>" in as_admin


def test_nvlink_peers_numa_node_and_cpu_affinity(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=2)

    html = client.get(f"/gpus/{gpu.uuid}/").content.decode()

    peers = section(html, "links-title")
    assert len(re.findall(r'<span class="link link-nv">NV12</span>', peers)) == 7
    assert "to 7 of its 7 peers" in html
    assert re.search(rf'<dd class="numa">{gpu.numa_node} / {gpu.socket}</dd>', html)
    assert f'<dd class="cpu-affinity">{gpu.cpu_affinity}</dd>' in html and gpu.cpu_affinity


def test_health_events_their_trend_and_the_open_quarantine(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=1)
    cause = health_event(gpu, EventKind.XID, xid=79)
    health_event(gpu, EventKind.XID, xid=48, days_ago=3)
    health_event(gpu, EventKind.ECC_CORRECTED, days_ago=3)
    health_event(gpu, EventKind.THERMAL, days_ago=40)  # outside the 30-day trend
    health_event(Gpu.objects.get(node__hostname=host, index=2), EventKind.XID, xid=13)
    Quarantine.objects.create(gpu=gpu, cause=cause)

    health = section(client.get(f"/gpus/{gpu.uuid}/").content.decode(), "health-title")

    assert re.search(r'data-count="events-30d">3<', health)
    assert "(2 XID, 1 memory" in health
    bars = re.findall(r'<div class="trend-day" title="([^"]+)">', health)
    assert len(bars) == 30
    three_days_ago = timezone.localdate() - timedelta(days=3)
    assert f"{three_days_ago:%Y-%m-%d}: 1 XID, 1 memory, 0 other" in bars
    assert f"{timezone.localdate():%Y-%m-%d}: 1 XID, 0 memory, 0 other" == bars[-1]
    rows = re.findall(r'<tr class="sev-critical"><td>[^<]+</td><td>(.*?)</td>', health, re.S)
    assert [re.sub(r"<[^>]+>", "", what, flags=re.S).split(" ")[:2] for what in rows] == [
        ["XID", "79"], ["Correctable", "ECC"], ["XID", "48"], ["Thermal"],
    ]  # fmt: skip
    assert "fallen off the bus" in rows[0].lower()  # the XID catalog's name
    assert "Quarantined (Fenced)" in health and "fenced: degraded" in health


def test_every_allocation_the_gpu_has_had_with_user_job_and_dates(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=6)
    old = allocate(gpu, "alice", released=True, days_ago=10)
    now = allocate(gpu, "bob", released=False)
    allocate(Gpu.objects.get(node__hostname=host, index=7), "carol", released=True)

    allocations = section(client.get(f"/gpus/{gpu.uuid}/").content.decode(), "allocations-title")

    rows = re.findall(r"<tr[^>]*><td><a href=\"/jobs/(\d+)/\">.*?</tr>", allocations, re.S)
    assert rows == [str(now.job_id), str(old.job_id)]  # newest first
    assert "<td>bob</td>" in allocations and "<td>alice</td>" in allocations
    assert "carol" not in allocations
    assert "<strong>holds it now</strong>" in allocations
    assert f"{timezone.localtime(old.allocated_at):%Y-%m-%d %H:%M:%S}" in allocations
    assert f"{timezone.localtime(old.released_at):%Y-%m-%d %H:%M:%S}" in allocations


def test_a_long_allocation_history_shows_the_last_50_and_links_to_the_rest(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=6)
    for days in range(55):
        allocate(gpu, "alice", released=True, days_ago=days + 1)

    allocations = section(client.get(f"/gpus/{gpu.uuid}/").content.decode(), "allocations-title")

    assert allocations.count('<a href="/jobs/') == 50
    assert 'data-count="allocations">55<' in allocations
    assert f'href="/api/v1/allocations/?gpu={gpu.uuid}"' in allocations


def test_a_gpu_never_allocated_nor_sick_says_so(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=7)
    html = client.get(f"/gpus/{gpu.uuid}/").content.decode()
    assert "Never allocated." in section(html, "allocations-title")
    assert "No health events recorded." in section(html, "health-title")


def test_the_gpu_page_query_count_does_not_grow_with_its_history(
    client, django_assert_max_num_queries
):
    host = unique_host()
    add_node(host, busy={3: 40})
    gpu = Gpu.objects.get(node__hostname=host, index=3)
    allocate(gpu, "alice", released=True, days_ago=1)
    health_event(gpu, EventKind.XID, xid=48, days_ago=1)
    with django_assert_max_num_queries(20) as one:
        client.get(f"/gpus/{gpu.uuid}/")
    for days in range(2, 60):
        allocate(gpu, f"user{days % 7}", released=True, days_ago=days)
        health_event(gpu, EventKind.XID, xid=13, days_ago=days % 40)
    with django_assert_max_num_queries(len(one.captured_queries)):
        response = client.get(f"/gpus/{gpu.uuid}/")
    allocations = section(response.content.decode(), "allocations-title")
    assert allocations.count('<a href="/jobs/') == 50


def test_the_gpu_page_poll_reads_little(client, django_assert_max_num_queries):
    host = unique_host()
    add_node(host, busy={3: 40})
    gpu = Gpu.objects.get(node__hostname=host, index=3)
    with django_assert_max_num_queries(3):  # the GPU and its node, who holds it
        client.get(f"/gpus/{gpu.uuid}/", HTTP_HX_REQUEST="true")


def test_the_node_page_shows_its_gpus_state_events_and_links(client, admin_client):
    host = unique_host()
    add_node(host, busy={2: 80})
    gpu = Gpu.objects.get(node__hostname=host, index=2)
    health_event(gpu, EventKind.XID, xid=79)
    set_gpu_state(Gpu.objects.get(node__hostname=host, index=5), "resetting", actor_name="health",
                  reason="XID 48: resetting through the agent")  # fmt: skip

    response = client.get(f"/nodes/{host}/")

    html = response.content.decode()
    assert response.status_code == 200 and f"<title>gpuadmin: {host}</title>" in html
    assert html.count('class="gpu-row"') == 8
    assert f'href="/nodes/{host}/topology/"' in html and f'href="/nodes/{host}/mig/"' in html
    assert re.search(r'data-count="resetting">1 resetting<', html)
    assert re.search(r'data-count="foreign">1 foreign<', html)
    health = section(html, "health-title")
    assert f'<a href="/gpus/{gpu.uuid}/">GPU2</a>' in health and "XID 79" in health
    assert 'id="history-title"' not in html  # the audit history is for admins
    assert "<td>node.topology_changed</td>" in section(
        admin_client.get(f"/nodes/{host}/").content.decode(), "history-title"
    )
    assert client.get("/nodes/nope/").status_code == 404
    live = client.get(f"/nodes/{host}/", HTTP_HX_REQUEST="true").content.decode()
    assert live.lstrip().startswith('<div id="node-live"') and "Facts" not in live


def test_the_node_topology_and_gpu_pages_link_the_node_page(client):
    host = unique_host()
    add_node(host)
    gpu = Gpu.objects.get(node__hostname=host, index=0)
    for path in (f"/gpus/{gpu.uuid}/", f"/nodes/{host}/topology/", f"/nodes/{host}/mig/",
                 f"/fleet/?node={host}"):  # fmt: skip
        assert f'href="/nodes/{host}/"' in client.get(path).content.decode(), path

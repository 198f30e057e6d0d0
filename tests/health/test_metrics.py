"""``GET /metrics``: dcgm-exporter's names, types, HELP and labels (checked with Prometheus's
text parser against ../shared/fixtures/real/dcgm-exporter/), gpuadmin's own series, and who
may read it."""

from __future__ import annotations

import csv
import gc
import gzip
import json
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuadmin import metrics
from health.choices import AlertState, EventKind, Severity
from health.metrics import HealthCollector
from health.models import Alert, HealthEvent
from inventory import live
from inventory.choices import GpuState
from inventory.models import Gpu, Node
from inventory.nvml.scanner import scan, throttle_reason_mask, throttle_reason_names
from inventory.nvml.sim import SimulatedNvml, faults
from inventory.services import set_gpu_state
from scheduling.allocations import manual
from scheduling.jobs import submission
from scheduling.models import Allocation, Job
from tests.conftest import REPO_DIR, SHARED_DIR
from tests.scheduling.conftest import add_sim_node, broker  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

FIXTURES = SHARED_DIR / "fixtures" / "real" / "dcgm-exporter"
GPU_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}
MIG_LABELS = {"GPU_I_PROFILE", "GPU_I_ID"}


def exporter_counters() -> dict[str, tuple[str, str]]:
    """default-counters.csv: DCGM field -> (Prometheus type, HELP), the lines commented out
    (off by default in dcgm-exporter) included."""
    table = {}
    for line in (FIXTURES / "default-counters.csv").read_text().splitlines():
        row = next(csv.reader([line.lstrip("# ")]), [])
        if len(row) >= 3 and row[0].strip().startswith("DCGM_FI_"):
            name, kind, help_text = (cell.strip() for cell in row[:3])
            table[name] = (kind, ",".join([help_text, *row[3:]]).strip())
    return table


def dcgm_field_names() -> set[str]:
    """Every DCGM device field name `dcgmi dmon -l` lists (``DCGM_FI_DEV_`` + its long name;
    field 112 keeps its dcgm_fields.h name, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)."""
    listing = (FIXTURES / "llm-action__dcgmi-dmon-l__field-list.txt").read_text()
    names = {
        f"DCGM_FI_DEV_{long_name.upper()}"
        for long_name in re.findall(r"^(\w+)\s+\S+\s+\d+\s*$", listing, re.M)
    }
    return names | {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}


def capture_label_names(name: str) -> set[str]:
    """The label names of a real dcgm-exporter capture's series."""
    text = (FIXTURES / name).read_text()
    families = text_string_to_metric_families(text)
    (labels,) = {frozenset(s.labels) for family in families for s in family.samples}
    return set(labels)


@pytest.fixture(autouse=True)
def own_sample_stream(settings) -> Iterator[None]:
    """Samples published here go to a stream of this test's own (sessions share Redis)."""
    settings.GPUADMIN_SAMPLE_STREAM = f"gpuadmin:test-samples:{uuid.uuid4().hex}"
    yield
    live.client().delete(settings.GPUADMIN_SAMPLE_STREAM)


@pytest.fixture
def sim_node() -> Iterator[Any]:
    """``sim_node(model)`` -> a discovered, heartbeating simulated node whose agent has
    published a sample of every section (facts, metrics, health); its samples are dropped
    after the test."""
    hostnames = []

    def make(model: str = "dgx-h100") -> Node:
        hostname = f"metrics-{uuid.uuid4().hex[:8]}"  # Redis is shared with other sessions
        hostnames.append(hostname)
        node = add_sim_node(hostname, model)
        publish(hostname, model)
        return node

    yield make
    for hostname in hostnames:
        live.client().delete(live.KEY_PREFIX + hostname)


def publish(hostname: str, model: str) -> None:
    nvml = SimulatedNvml.from_model(model, node_name=hostname)
    live.publish(hostname, scan(nvml, include=("facts", "metrics", "health")))


def scrape(client, **headers: str) -> dict[str, Any]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def series(families: dict[str, Any], name: str, **labels: str) -> list[Any]:
    return [
        sample
        for sample in families[name].samples
        if all(sample.labels.get(key) == value for key, value in labels.items())
    ]


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    (sample,) = series(families, name, **labels)
    return sample.value


def test_dcgm_series_have_the_exporters_names_types_help_and_labels(client, sim_node):
    node = sim_node("dgx-h100")
    families = scrape(client)
    exporter = exporter_counters()
    known = set(exporter) | dcgm_field_names()
    dcgm = {name: family for name, family in families.items() if name.startswith("DCGM_")}
    # The fields the simulated H100 reports, under dcgm-exporter's names.
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    } <= set(dcgm)
    for name, family in dcgm.items():
        assert name in known, f"{name} is no DCGM field"
        if name in exporter:
            kind, help_text = exporter[name]
            assert family.documentation == help_text, name
            # Counters keep their name, untyped: prometheus-client would add "_total".
            assert family.type == ("gauge" if kind == "gauge" else "unknown"), name
        else:
            assert family.type == "gauge", name
        assert [s.name for s in family.samples] == [name] * len(family.samples)
        assert {frozenset(s.labels) for s in family.samples} == {frozenset(GPU_LABELS)}, name
    v100 = capture_label_names("issue__NVIDIA-dcgm-exporter-250__V100__metrics.PARTIAL.txt")
    assert v100 == GPU_LABELS
    # One series per GPU, labelled as dcgm-exporter labels them.
    gpus = Gpu.objects.filter(node=node).order_by("index")
    assert [s.labels for s in families["DCGM_FI_DEV_SM_CLOCK"].samples] == [
        {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "device": f"nvidia{gpu.index}",
            "modelName": gpu.name,
            "Hostname": node.hostname,
        }
        for gpu in gpus
    ]
    # The values are the live sample's.
    (samples,) = live.latest([node.hostname]).values()
    first = gpus[0]
    sample = samples[first.uuid]
    assert value(families, "DCGM_FI_DEV_GPU_TEMP", UUID=first.uuid) == sample["temperature_c"]
    assert value(families, "DCGM_FI_DEV_FB_USED", UUID=first.uuid) == sample["memory_used_mib"]
    assert value(families, "DCGM_FI_DEV_FB_FREE", UUID=first.uuid) == (
        sample["memory_total_mib"] - sample["memory_used_mib"]
    )
    assert value(families, "DCGM_FI_DEV_POWER_USAGE", UUID=first.uuid) == sample["power_w"]
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", UUID=first.uuid) == 0


def test_a_mig_gpu_has_a_series_per_gpu_instance_and_no_utilization(client, sim_node):
    """dgx-a100-40gb: GPU 0 is in MIG mode (3g.20gb as GI 2, 2g.10gb as GIs 3 and 4)."""
    node = sim_node("dgx-a100-40gb")
    families = scrape(client)
    mig_gpu = Gpu.objects.get(node=node, index=0)
    whole_gpu = Gpu.objects.get(node=node, index=2)
    clocks = series(families, "DCGM_FI_DEV_SM_CLOCK", UUID=mig_gpu.uuid)
    assert sorted((s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]) for s in clocks) == [
        ("2", "3g.20gb"),
        ("3", "2g.10gb"),
        ("4", "2g.10gb"),
    ]
    capture = capture_label_names("issue__NVIDIA-dcgm-exporter-317__A30-MIG__metrics.PARTIAL.txt")
    assert capture == GPU_LABELS | MIG_LABELS
    assert {frozenset(s.labels) for s in clocks} == {frozenset(capture)}
    assert {s.labels["device"] for s in clocks} == {"nvidia0"}
    # NVML cannot measure a MIG GPU's utilization: no series, never a 0.
    assert series(families, "DCGM_FI_DEV_GPU_UTIL", UUID=mig_gpu.uuid) == []
    assert len(series(families, "DCGM_FI_DEV_GPU_UTIL", UUID=whole_gpu.uuid)) == 1
    # Memory is each GPU instance's own.
    (samples,) = live.latest([node.hostname]).values()
    instances = {str(i["gi_id"]): i for i in samples[mig_gpu.uuid]["mig"]}
    for sample in series(families, "DCGM_FI_DEV_FB_USED", UUID=mig_gpu.uuid):
        assert sample.value == instances[sample.labels["GPU_I_ID"]]["memory_used_mib"]
    for sample in series(families, "DCGM_FI_DEV_FB_FREE", UUID=mig_gpu.uuid):
        instance = instances[sample.labels["GPU_I_ID"]]
        assert sample.value == instance["memory_total_mib"] - instance["memory_used_mib"]


def test_clock_throttle_reasons_are_nvmls_bitmask(client, sim_node):
    mask = 0x001 | 0x040 | 0x080 | 0x1000  # idle, HW thermal, HW power brake, an unknown bit
    assert throttle_reason_mask(throttle_reason_names(mask)) == mask
    node = sim_node("dgx-h100")
    nvml = SimulatedNvml.from_model("dgx-h100", node_name=node.hostname)
    faults.power_brake(nvml, node.hostname, 1)
    live.publish(node.hostname, scan(nvml, include=("facts", "metrics", "health")))
    families = scrape(client)
    braked, calm = (Gpu.objects.get(node=node, index=index).uuid for index in (1, 0))
    assert int(value(families, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", UUID=braked)) & 0x80
    assert not int(value(families, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", UUID=calm)) & 0x80


def test_xid_errors_is_the_gpus_last_xid(client, sim_node):
    node = sim_node()
    gpu, other = Gpu.objects.filter(node=node).order_by("index")[:2]
    now = timezone.now()
    for xid, ago in ((79, 10), (48, 60)):
        HealthEvent.objects.create(
            node=node,
            gpu=gpu,
            kind=EventKind.XID,
            xid=xid,
            severity=Severity.CRITICAL,
            occurred_at=now - timedelta(seconds=ago),
            dedupe_key=f"{node.hostname}:xid:{gpu.uuid}:{xid}",
        )
    families = scrape(client)
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", UUID=gpu.uuid) == 79
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", UUID=other.uuid) == 0


def test_without_a_live_sample_a_gpu_has_no_dcgm_series(client, sim_node):
    quiet, talking = sim_node(), sim_node()
    live.client().delete(live.KEY_PREFIX + quiet.hostname)
    families = scrape(client)
    hosts = {s.labels["Hostname"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert quiet.hostname not in hosts and talking.hostname in hosts
    # Its state is still known.
    assert len(series(families, "gpuadmin_gpu_state", Hostname=quiet.hostname)) == 8


def test_gpu_states_nodes_and_alerts(client, sim_node):
    node, gone = sim_node(), sim_node()
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    set_gpu_state(gpus[0], GpuState.DRAINING, actor_name="tests", reason="maintenance")
    Gpu.objects.filter(pk=gpus[1].pk).update(missing_since=timezone.now())
    Node.objects.filter(pk=gone.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    for severity in (Severity.CRITICAL, Severity.CRITICAL, Severity.WARNING):
        Alert.objects.create(
            fingerprint=f"test:{uuid.uuid4().hex}", severity=severity, summary="hot"
        )
    Alert.objects.create(
        fingerprint="test:old", severity=Severity.INFO, summary="old", state=AlertState.RESOLVED
    )
    families = scrape(client)
    assert value(families, "gpuadmin_gpu_state", UUID=gpus[0].uuid) == 1
    assert series(families, "gpuadmin_gpu_state", UUID=gpus[0].uuid)[0].labels["state"] == (
        "draining"
    )
    assert series(families, "gpuadmin_gpu_state", UUID=gpus[1].uuid)[0].labels["state"] == (
        "missing"
    )
    counts = {s.labels["state"]: s.value for s in families["gpuadmin_gpus"].samples}
    assert counts == {
        "available": 14,
        "draining": 1,
        "missing": 1,
        "degraded": 0,
        "resetting": 0,
        "offline": 0,
    }
    assert value(families, "gpuadmin_node_reachable", Hostname=node.hostname) == 1
    assert value(families, "gpuadmin_node_reachable", Hostname=gone.hostname) == 0
    firing = {s.labels["severity"]: s.value for s in families["gpuadmin_alerts_firing"].samples}
    assert firing == {"info": 0, "warning": 1, "critical": 2}


def test_allocations_queue_length_and_waits(client, sim_node, broker):  # noqa: F811
    node = sim_node()
    users = get_user_model().objects
    alice, bob = users.create_user("alice"), users.create_user("bob")
    free = iter(Gpu.objects.filter(node=node).order_by("index"))
    for owner, project, count in ((alice, "vision", 2), (alice, "nlp", 1), (bob, "", 1)):
        job = submission.submit_job(owner, command=["true"], gpu_count=count, project=project)
        manual.allocate_by_hand(job, [next(free).uuid for _ in range(count)], actor=alice)
    waiting = [submission.submit_job(bob, command=["true"]) for _ in range(3)]
    now = timezone.now()
    for job, minutes in zip(waiting, (30, 10, 1), strict=True):
        type(job).objects.filter(pk=job.pk).update(submitted_at=now - timedelta(minutes=minutes))
    families = scrape(client)
    held = {
        (s.labels["user"], s.labels["project"]): s.value
        for s in families["gpuadmin_allocated_gpus"].samples
    }
    assert held == {("alice", "vision"): 2, ("alice", "nlp"): 1, ("bob", ""): 1}
    # Two MPS shares of one GPU: one GPU held.
    shared = next(free)
    Gpu.objects.filter(pk=shared.pk).update(mps_shared=True)
    for percent in (30, 50):
        job = Job.objects.create(
            owner=bob, command=["x"], state="running", mps_percent=percent, project="mps"
        )
        Allocation.objects.create(
            job=job, gpu=shared, node=node, kind="mps", mps_percent=percent, attempt=1
        )
    held = {
        (s.labels["user"], s.labels["project"]): s.value
        for s in scrape(client)["gpuadmin_allocated_gpus"].samples
    }
    assert held[("bob", "mps")] == 1
    jobs = {s.labels["state"]: s.value for s in families["gpuadmin_jobs"].samples}
    assert jobs["queued"] == 3 and jobs["scheduled"] == 3 and "completed" not in jobs
    oldest = value(families, "gpuadmin_queue_oldest_wait_seconds")
    median = value(families, "gpuadmin_queue_median_wait_seconds")
    assert 30 * 60 <= oldest < 31 * 60
    assert 10 * 60 <= median < 11 * 60


def test_no_waiting_job_means_no_wait_series(client):
    families = scrape(client)
    assert families["gpuadmin_queue_oldest_wait_seconds"].samples == []
    assert families["gpuadmin_queue_median_wait_seconds"].samples == []


def test_the_text_format_whatever_the_scraper_prefers(client, sim_node):
    """Prometheus asks for OpenMetrics first; dcgm-exporter answers in the text format."""
    sim_node()
    response = client.get(
        "/metrics", HTTP_ACCEPT="application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    )
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in response.text


def test_a_scrape_costs_the_same_queries_for_any_fleet_size(
    client, sim_node, django_assert_num_queries
):
    sim_node()
    with django_assert_num_queries(QUERIES_PER_SCRAPE):
        scrape(client)
    sim_node(), sim_node()
    with django_assert_num_queries(QUERIES_PER_SCRAPE):
        scrape(client)


# GPUs, XIDs, nodes, alerts; allocations, jobs, waits; Slurm clusters and Ray clusters (none
# registered).
QUERIES_PER_SCRAPE = 9


def test_the_metrics_token_guards_the_endpoint(client, settings):
    settings.GPUADMIN_METRICS_TOKEN = "scrape-me-0123456789"
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-me-0123456789").status_code == (
        401
    )
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scr\u00e9pe").status_code == 401
    allowed = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-0123456789")
    assert allowed.status_code == 200
    assert "gpuadmin_gpus" in allowed.text


def test_the_grafana_dashboard_queries_only_series_we_export(client, sim_node):
    sim_node("dgx-h100")
    response = client.get("/metrics")
    families = list(text_string_to_metric_families(response.text))
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    dashboard = json.loads((REPO_DIR / "deploy/grafana/dashboards/gpuadmin.json").read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ] + [variable["definition"] for variable in dashboard["templating"]["list"][1:]]
    used = {name for query in queries for name in re.findall(r"\b(?:DCGM_FI|gpuadmin)_\w+", query)}
    assert len(used) >= 20
    assert used - exported == set()


@pytest.fixture
def test_fleet(sim_node) -> list[Node]:
    """Three nodes: a MIG one, one with an XID, a firing alert and an escaped model name, and
    one without a live sample with a missing GPU."""
    mig, xid, quiet = sim_node("dgx-a100-40gb"), sim_node(), sim_node()
    gpu = Gpu.objects.filter(node=xid).order_by("index").first()
    assert gpu is not None
    HealthEvent.objects.create(
        node=xid,
        gpu=gpu,
        kind=EventKind.XID,
        xid=79,
        severity=Severity.CRITICAL,
        occurred_at=timezone.now(),
        dedupe_key=f"{xid.hostname}:xid:{gpu.uuid}:79",
    )
    Gpu.objects.filter(pk=gpu.pk).update(name='NVIDIA "H100" \\ 80GB')
    Alert.objects.create(fingerprint=f"test:{uuid.uuid4().hex}", severity=Severity.WARNING)
    live.client().delete(live.KEY_PREFIX + quiet.hostname)
    Gpu.objects.filter(node=quiet, index=7).update(missing_since=timezone.now())
    return [mig, xid, quiet]


def samples(text: str) -> set[tuple[str, frozenset[tuple[str, str]], float]]:
    found = [
        (s.name, frozenset(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert len(found) == len(set(found))
    return set(found)


def test_the_text_is_what_prometheus_client_writes_for_the_same_families(client, test_fleet):
    """The health series are written directly (fast at fleet size): byte for byte what
    generate_latest() writes from collect()'s prometheus-client families."""
    collector = HealthCollector()
    assert collector.text() == generate_latest(collector).decode()
    assert client.get("/metrics").text == generate_latest(metrics.REGISTRY).decode()


def test_the_label_text_kept_from_the_last_scrape_follows_the_catalog(client, test_fleet):
    """A whole-fleet scrape keeps its series' label text for the next one: a renamed GPU, a
    GPU's new state and a new MIG layout are written anew, never as they were."""
    mig, xid, _ = test_fleet
    client.get("/metrics")
    gpu = Gpu.objects.filter(node=mig).order_by("index").first()
    assert gpu is not None
    Gpu.objects.filter(pk=gpu.pk).update(name="NVIDIA A100 (renamed)")
    Gpu.objects.filter(node=xid, index=1).update(state=GpuState.DRAINING)
    redis, key = live.client(), live.KEY_PREFIX + mig.hostname
    sample = json.loads(redis.hget(key, gpu.uuid))
    for instance in sample["mig"]:
        instance["gi_id"] += 100
    redis.hset(key, gpu.uuid, json.dumps(sample))

    text = client.get("/metrics").text
    assert text == generate_latest(metrics.REGISTRY).decode()
    found = [(name, dict(labels)) for name, labels, _ in samples(text)]
    renamed = [labels for _, labels in found if labels.get("UUID") == gpu.uuid]
    assert {labels["modelName"] for labels in renamed} == {"NVIDIA A100 (renamed)"}
    assert {labels.get("GPU_I_ID") for labels in renamed} == {
        None,  # its state and NVLink series
        *(str(instance["gi_id"]) for instance in sample["mig"]),
    }
    assert [
        labels["state"]
        for name, labels in found
        if name == "gpuadmin_gpu_state"
        and labels["Hostname"] == xid.hostname
        and labels["gpu"] == "1"
    ] == ["draining"]


def test_a_node_scrape_is_the_fleets_series_of_that_node(client, test_fleet):
    """/metrics/nodes/<hostname> says what /metrics says with that Hostname; /metrics/fleet the
    rest: together, /metrics."""
    fleet = samples(client.get("/metrics").text)
    per_node = set()
    for node in test_fleet:
        response = client.get(f"/metrics/nodes/{node.hostname}")
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        mine = samples(response.text)
        assert mine == {s for s in fleet if ("Hostname", node.hostname) in s[1]}
        per_node |= mine
    rest = samples(client.get("/metrics/fleet").text)
    assert {name for name, _, _ in rest} >= {"gpuadmin_gpus", "gpuadmin_alerts_firing"}
    assert all(not any(k == "Hostname" for k, _ in labels) for _, labels, _ in rest)
    assert per_node.isdisjoint(rest)
    assert per_node | rest == fleet
    assert client.get("/metrics/nodes/no-such-node").status_code == 404


def test_a_node_scrape_costs_the_same_few_queries_for_any_fleet_size(
    client, sim_node, django_assert_num_queries
):
    node = sim_node()
    # GPUs, the node's reachability, XIDs; nothing of the fleet's totals.
    with django_assert_num_queries(3):
        client.get(f"/metrics/nodes/{node.hostname}")
    sim_node(), sim_node()
    with django_assert_num_queries(3):
        client.get(f"/metrics/nodes/{node.hostname}")


def test_targets_list_a_scrape_per_node_for_http_service_discovery(client, settings, sim_node):
    settings.ALLOWED_HOSTS = ["gpuadmin.example"]
    nodes = sorted([sim_node(), sim_node()], key=lambda node: node.hostname)
    response = client.get("/metrics/targets", HTTP_HOST="gpuadmin.example:8000")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    mine = [t for t in response.json() if t["labels"]["instance"] in {n.hostname for n in nodes}]
    assert mine == [
        {
            "targets": ["gpuadmin.example:8000"],
            "labels": {
                "__metrics_path__": f"/metrics/nodes/{node.hostname}",
                "instance": node.hostname,
            },
        }
        for node in nodes
    ]


@pytest.mark.parametrize("path", ["/metrics/fleet", "/metrics/targets", "/metrics/nodes/x"])
def test_the_metrics_token_guards_the_fleet_node_and_target_endpoints(client, settings, path):
    settings.GPUADMIN_METRICS_TOKEN = "scrape-me-0123456789"
    refused = client.get(path)
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get(path, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    allowed = client.get(path, HTTP_AUTHORIZATION="Bearer scrape-me-0123456789")
    assert allowed.status_code in (200, 404)


def test_a_scrape_leaves_the_cycle_collector_as_it_found_it(client, sim_node):
    """The whole-fleet scrape pauses the cycle collector: running again after it, and still
    off if something else had turned it off."""
    sim_node()
    assert client.get("/metrics").status_code == 200
    assert gc.isenabled()
    gc.disable()
    try:
        assert client.get("/metrics").status_code == 200
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_gzip_scrape_is_compressed_once_to_the_same_text(client, sim_node):
    sim_node()
    plain = client.get("/metrics")
    compressed = client.get("/metrics", HTTP_ACCEPT_ENCODING="gzip")
    assert compressed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in compressed["Vary"]
    assert gzip.decompress(compressed.content) == plain.content
    assert "Content-Encoding" not in plain

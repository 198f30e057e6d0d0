"""docker-compose.yml cannot run here (no Docker engine): check it against the settings."""

import json
import re

import yaml

from gpuadmin.env import NODE_SETTINGS
from tests.conftest import APP_PACKAGES, REPO_DIR
from tests.gpuadmin.test_settings_documented import (
    documented_settings,
    env_example,
    read_by_the_code,
)

COMPOSE = yaml.safe_load((REPO_DIR / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_services_and_images():
    assert set(SERVICES) == {
        "postgres",
        "redis",
        "migrate",
        "web",
        "grpc",
        "worker",
        "beat",
        "agent",
        "prometheus",
        "grafana",
    }
    assert SERVICES["postgres"]["image"] == "postgres:16"
    assert SERVICES["redis"]["image"] == "redis:7"


def test_app_services_run_the_gpuadmin_verbs():
    assert SERVICES["web"]["command"] == ["gpuadmin", "serve", "--bind", "0.0.0.0:8000"]
    assert SERVICES["worker"]["command"] == ["gpuadmin", "worker"]
    assert SERVICES["grpc"]["command"] == ["gpuadmin", "grpc", "--bind", "0.0.0.0:50051"]
    assert SERVICES["beat"]["command"] == ["gpuadmin", "beat"]
    assert "gpuadmin agent --node" in " ".join(SERVICES["agent"]["command"])
    assert SERVICES["agent"]["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_the_central_services_start_after_the_migration_has_finished():
    """One one-shot service migrates; web, grpc, worker and beat start only once it has exited
    0 (a worker or beat on an unmigrated schema fails on missing tables or columns)."""
    datastores = {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
    }
    migrate = SERVICES["migrate"]
    assert migrate["command"] == ["gpuadmin", "manage", "migrate", "--noinput"]
    assert migrate["depends_on"] == datastores
    # A restart policy would start it again after it exits 0, and it never counts as completed.
    assert migrate["restart"] == "no"
    for name in ("web", "grpc", "worker", "beat"):
        assert SERVICES[name]["depends_on"] == {
            **datastores,
            "migrate": {"condition": "service_completed_successfully"},
        }, name
        assert "migrate" not in " ".join(SERVICES[name]["command"]), name


def test_a_gpu_node_gets_the_broker_and_its_credential_only():
    env = SERVICES["agent"]["environment"]
    assert "DATABASE_URL" not in env and "SECRET_KEY" not in env
    assert {"REDIS_URL", "GPUADMIN_NODE_NAME", "GPUADMIN_NODE_TOKEN"} <= set(env)


def test_a_node_is_given_the_settings_its_docs_list_and_only_those():
    """One list (``gpuadmin.env.NODE_SETTINGS``): the agents page's, the compose agent's, and
    what `gpuadmin up` gives its demo agents."""
    section = (REPO_DIR / "docs" / "administration" / "agents.md").read_text()
    listed = section.split("A node reads these settings and no others", 1)[1].split("\n\n")[0]
    assert set(re.findall(r"`([A-Z0-9_]+)`", listed)) == NODE_SETTINGS
    assert documented_settings() >= NODE_SETTINGS
    compose_only = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
    assert set(SERVICES["agent"]["environment"]) - compose_only <= NODE_SETTINGS


def test_agent_is_a_gpu_profile_service_on_the_nvidia_runtime():
    agent = SERVICES["agent"]
    assert agent["profiles"] == ["gpu"]
    devices = agent["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert agent["environment"]["GPUADMIN_NVML"] == "real"


def test_environment_names_are_settings_the_app_reads():
    read = read_by_the_code()
    compose_only = {"POSTGRES_PASSWORD", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
    for name in ("web", "worker", "beat", "agent"):
        env = set(SERVICES[name]["environment"])
        assert env - compose_only <= read, name
    assert env_example() <= read | compose_only, "no stale names in .env.example"
    database_url = SERVICES["web"]["environment"]["DATABASE_URL"]
    assert database_url.startswith("postgresql://gpuadmin:") and database_url.endswith(
        "@postgres:5432/gpuadmin"
    )
    assert SERVICES["web"]["environment"]["REDIS_URL"] == "redis://redis:6379/0"


def mounts(service: str) -> dict[str, str]:
    """Container path -> the repository file or folder bound there (named volumes left out)."""
    bound = {}
    for volume in SERVICES[service]["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            assert (REPO_DIR / source).exists(), source
            bound[target] = source
    return bound


def test_prometheus_and_grafana_are_a_monitoring_profile_on_the_shipped_files():
    prometheus, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert mounts("prometheus") == {
        "/etc/prometheus/prometheus.yml": "./deploy/prometheus/prometheus.yml"
    }
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    # Prometheus scrapes the web service's /metrics, once web answers its health probe.
    scrape = yaml.safe_load((REPO_DIR / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["web:8000"]}]
    # Or one target per node, discovered from web, and the fleet's own series beside them.
    per_node = yaml.safe_load((REPO_DIR / "deploy/prometheus/prometheus-per-node.yml").read_text())
    fleet, nodes = per_node["scrape_configs"]
    assert (fleet["metrics_path"], fleet["static_configs"]) == (
        "/metrics/fleet",
        [{"targets": ["web:8000"]}],
    )
    (discovery,) = nodes["http_sd_configs"]
    assert discovery["url"] == "http://web:8000/metrics/targets"
    assert SERVICES["web"]["ports"] == ["8000:8000"]
    assert prometheus["depends_on"] == {"web": {"condition": "service_healthy"}}
    # Grafana: the data source is that Prometheus, the dashboards those of deploy/grafana.
    assert mounts("grafana") == {
        "/etc/grafana/provisioning": "./deploy/grafana/provisioning",
        "/etc/grafana/dashboards": "./deploy/grafana/dashboards",
    }
    provisioning = REPO_DIR / "deploy/grafana/provisioning"
    sources = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    assert "9090:9090" in prometheus["ports"]
    providers = yaml.safe_load((provisioning / "dashboards/gpuadmin.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    dashboards = list((REPO_DIR / "deploy/grafana/dashboards").glob("*.json"))
    assert [json.loads(path.read_text())["uid"] for path in dashboards] == ["gpuadmin-gpus"]


def test_the_image_holds_every_app_package():
    """The image copies each package ``INSTALLED_APPS`` imports (one forgotten, the image's
    processes fail at start with an ImportError that no test here would see otherwise)."""
    copied = re.findall(r"^COPY (\S+) \1$", (REPO_DIR / "Dockerfile").read_text(), re.MULTILINE)
    assert set(APP_PACKAGES) <= set(copied)

"""A real Prometheus (Debian's ``prometheus`` package, installed by .ci/install-prometheus)
scrapes a real HTTP server with each shipped scrape configuration (the whole fleet's
``/metrics``; one target per node through ``/metrics/targets``) and answers a PromQL query for a
GPU's utilization with the same labels."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inventory import live
from inventory.models import Gpu
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml
from tests.conftest import REPO_DIR
from tests.scheduling.conftest import add_sim_node
from tests.tools import debian_program

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCRAPE_CONFIG = REPO_DIR / "deploy" / "prometheus" / "prometheus.yml"
PER_NODE_CONFIG = REPO_DIR / "deploy" / "prometheus" / "prometheus-per-node.yml"
TOKEN = "prometheus-test-token-0123456789"
WAIT_S = 60


def prometheus_binary() -> str:
    return debian_program("prometheus", "install-prometheus")


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.fixture(params=[SCRAPE_CONFIG, PER_NODE_CONFIG], ids=["fleet", "per-node"])
def prometheus(request, live_server, settings, tmp_path: Path, free_port: int) -> Iterator[str]:
    """Prometheus scraping the live server every second with a shipped configuration's jobs
    (service discovery every second too), their bearer token included; its HTTP API's base
    URL."""
    binary = prometheus_binary()
    settings.GPUADMIN_METRICS_TOKEN = TOKEN
    config = yaml.safe_load(request.param.read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    address = urllib.parse.urlsplit(live_server.url).netloc
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    authorization = {"type": "Bearer", "credentials_file": str(token_file)}
    for job in config["scrape_configs"]:
        job["authorization"] = authorization
        if "static_configs" in job:
            job["static_configs"] = [{"targets": [address]}]
        for discovery in job.get("http_sd_configs", ()):
            discovery["url"] = discovery["url"].replace("web:8000", address)
            discovery.update(refresh_interval="1s", authorization=authorization)
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    base_url = f"http://127.0.0.1:{free_port}"
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{free_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                urllib.request.urlopen(f"{base_url}/-/ready", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"prometheus did not start:\n{(tmp_path / 'prometheus.log').read_text()}"
                    )
                time.sleep(0.2)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture
def sim_node(settings) -> Iterator[str]:
    """A simulated node whose agent published a sample; its GPU 0 at 37% utilization."""
    hostname = f"prom-{uuid.uuid4().hex[:8]}"  # Redis is shared with other sessions
    settings.GPUADMIN_SAMPLE_STREAM = f"gpuadmin:test-samples:{hostname}"
    add_sim_node(hostname, "dgx-h100")
    nvml = SimulatedNvml.from_model("dgx-h100", node_name=hostname)
    live.publish(hostname, scan(nvml, include=("facts", "metrics", "health")), ttl_s=600)
    gpu = Gpu.objects.get(node__hostname=hostname, index=0)
    key = live.KEY_PREFIX + hostname
    sample = json.loads(live.client().hget(key, gpu.uuid))
    live.client().hset(key, gpu.uuid, json.dumps({**sample, "utilization_gpu_pct": 37}))
    yield hostname
    live.client().delete(key, settings.GPUADMIN_SAMPLE_STREAM)


def query(base_url: str, promql: str) -> list[dict[str, Any]]:
    answer = get_json(f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(base_url: str, promql: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    while not (result := query(base_url, promql)):
        if time.monotonic() > deadline:
            targets = get_json(f"{base_url}/api/v1/targets")["data"]["activeTargets"]
            pytest.fail(f"no answer to {promql} in {WAIT_S} s; targets: {targets}")
        time.sleep(0.5)
    return result


def test_prometheus_scrapes_metrics_and_answers_a_gpus_utilization(prometheus, sim_node):
    """The same series and labels whichever configuration scraped them; per node, the instance
    is the node's hostname."""
    gpu = Gpu.objects.get(node__hostname=sim_node, index=0)
    (series,) = wait_for(prometheus, f'DCGM_FI_DEV_GPU_UTIL{{UUID="{gpu.uuid}"}}')
    assert series["value"][1] == "37"
    assert series["metric"] == {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": "0",
        "UUID": gpu.uuid,
        "device": "nvidia0",
        "modelName": gpu.name,
        "Hostname": sim_node,
        "job": "gpuadmin",
        "instance": series["metric"]["instance"],
    }
    # dcgm-exporter's counters keep their names (no "_total" added).
    assert query(prometheus, f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{UUID="{gpu.uuid}"}}')
    # Per node, the fleet's totals come from the other job's scrape: waited for too.
    (available,) = wait_for(prometheus, 'gpuadmin_gpus{state="available"}')
    assert available["value"][1] == "8"
    # The scrapes went through the bearer token: the fleet's, and the node's when per node.
    ups = query(prometheus, 'up{job="gpuadmin"}')
    assert {up["value"][1] for up in ups} == {"1"}
    assert len(ups) == (1 if series["metric"]["instance"] != sim_node else 2)


@pytest.mark.parametrize("config", [SCRAPE_CONFIG, PER_NODE_CONFIG], ids=["fleet", "per-node"])
def test_the_shipped_scrape_configuration_is_valid(config: Path):
    promtool = Path(prometheus_binary()).with_name("promtool")
    check = subprocess.run(
        [str(promtool), "check", "config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr

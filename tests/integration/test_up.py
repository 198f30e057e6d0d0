"""`gpuadmin up` on a machine with no database or Redis configured: the embedded servers."""

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import psutil
import pytest

from tests.conftest import REPO_DIR

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 120


def read_until(process: subprocess.Popen, marker: str, timeout: float) -> str:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"{marker!r} not seen; output so far:\n{''.join(seen)}")


def log_in(base_url: str, username: str, password: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base_url}/admin/login/")
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode(
        {
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/admin/login/", data=form, headers={"Referer": f"{base_url}/admin/login/"}
    )
    assert "<title>Fleet catalog | gpuadmin</title>" in opener.open(request).read().decode()
    return opener


def test_up_starts_everything_serves_the_admin_and_stops_without_orphans(server_dir, free_port):
    tmp_path = server_dir
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"nodes": [{"name": "dgx-h100-01", "model": "dgx-h100"}]}))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    }
    env.update(
        GPUADMIN_DATA_DIR=str(tmp_path / "data"),
        GPUADMIN_SIM_FLEET=str(fleet),
        PYTHONUNBUFFERED="1",
    )
    base_url = f"http://127.0.0.1:{free_port}"
    up = subprocess.Popen(
        [sys.executable, "-m", "gpuadmin", "up", "--bind", f"127.0.0.1:{free_port}"],
        env=env,
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = read_until(up, "gpuadmin is up", START_TIMEOUT_S)
        password = re.search(r"username 'admin', password '([^']+)'", output).group(1)
        descendants = psutil.Process(up.pid).children(recursive=True)
        data_dir = tmp_path / "data"
        servers = [
            psutil.Process(int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])),
            psutil.Process(int((data_dir / "redis" / "redis.pid").read_text())),
        ]
        assert {"web", "worker", "beat", "agent dgx-h100-01"} <= set(
            re.findall(r"starting ([\w -]+?):", output)
        )

        deadline = time.monotonic() + 60
        while True:
            try:
                health = json.loads(urllib.request.urlopen(f"{base_url}/-/health").read())
                break
            except OSError:
                assert time.monotonic() < deadline, "web server never answered"
                time.sleep(0.5)
        assert health["status"] == "ok"
        admin = log_in(base_url, "admin", password)
        # The demo node's agent registered it and synced its GPUs through the central worker.
        deadline = time.monotonic() + 60
        while "dgx-h100-01/GPU7" not in (
            page := admin.open(f"{base_url}/admin/inventory/gpu/?q=dgx-h100-01").read().decode()
        ):
            assert time.monotonic() < deadline, "the demo node's GPUs never reached the catalog"
            time.sleep(0.5)
        assert "8 gpus" in page.lower()
        assert not (tmp_path / "data" / "secret_key").stat().st_mode & 0o077
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)

    assert up.returncode == 0, rest
    _, alive = psutil.wait_procs(descendants + servers, timeout=15)
    assert alive == []
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    assert not (data_dir / "redis" / "redis.pid").exists()

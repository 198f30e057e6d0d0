"""The poll asks the clusters at once: clusters that accept connections and never answer (as
a host behind a dropped route does) are unreachable after ``GPUADMIN_RAY_TIMEOUT_S``, together,
while the real cluster beside them is read and its job followed at once, not after them;
``ask_all`` keeps to its threads and its deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from django.utils import timezone

from integrations.ray import services, tasks
from integrations.ray.jobs_api import RayError, RayUnreachable, ask_all
from integrations.ray.models import ClusterState, RayCluster, RayJobState
from tests.integrations.ray.test_external_cluster import follow_until, person

TIMEOUT_S = 2.0
SILENT = 3


@pytest.fixture
def silent_addresses() -> Iterator[list[str]]:
    """Ports that accept connections (the kernel's backlog) and never answer."""
    with ExitStack() as stack:
        addresses = []
        for _ in range(SILENT):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            addresses.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
        yield addresses


@pytest.mark.django_db
@pytest.mark.integration
def test_silent_clusters_delay_neither_the_real_one_nor_the_tick(
    cluster, silent_addresses, free_port, settings
):
    settings.GPUADMIN_RAY_TIMEOUT_S = TIMEOUT_S
    for number, address in enumerate(silent_addresses):
        RayCluster.objects.create(name=f"silent-{number}", address=address)
    RayCluster.objects.create(name="refused", address=f"http://127.0.0.1:{free_port}")
    job = services.submit(owner=person("alice"), cluster=cluster, entrypoint="sleep 2; echo polled")
    services.send(job)  # pending in Ray, or running: active either way
    assert job.active, job.message

    started, began = time.monotonic(), timezone.now()
    assert tasks.poll() == {"clusters": 1, "jobs": 1}
    took = time.monotonic() - started

    # One after the other, the silent clusters alone would take SILENT timeouts.
    assert TIMEOUT_S <= took < 2 * TIMEOUT_S, took
    silent = RayCluster.objects.filter(name__startswith="silent-")
    # Their requests' own timeout is the poll's deadline: either may say so first.
    for state, error in silent.values_list("state", "last_error"):
        assert state == ClusterState.UNREACHABLE
        assert error.endswith(("did not answer: timed out", f"no answer within {TIMEOUT_S:g} s"))
    refused = RayCluster.objects.get(name="refused")
    assert refused.state == ClusterState.UNREACHABLE and "did not answer" in refused.last_error
    # The real cluster was stored as soon as it answered, not when the others gave up.
    cluster.refresh_from_db()
    assert (cluster.state, cluster.gpus) == (ClusterState.OK, 4)
    assert (cluster.last_read_at - began).total_seconds() < TIMEOUT_S / 2
    follow_until(job, lambda job: job.state == RayJobState.COMPLETED)


def test_ask_all_keeps_to_its_threads_and_its_deadline():
    running, most = 0, 0
    lock = threading.Lock()

    def question(seconds: float) -> float:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(seconds)
        with lock:
            running -= 1
        return seconds

    def refused() -> None:
        raise RayUnreachable("http://nowhere did not answer")

    questions = {n: (lambda: question(0.1)) for n in range(12)}
    questions[12] = lambda: question(5)  # past the deadline
    questions[13] = refused
    started = time.monotonic()
    answers = list(ask_all(questions, deadline_s=1.0, threads=4))
    assert time.monotonic() - started < 2
    assert most == 4
    assert answers[-1][0] == 12  # the late one comes last
    answered = dict(answers)
    assert [answered[n] for n in range(12)] == [0.1] * 12
    assert isinstance(answered[12], RayUnreachable)
    assert str(answered[12]) == "no answer within 1 s"
    assert isinstance(answered[13], RayError)
    assert str(answered[13]) == "http://nowhere did not answer"
    assert list(ask_all({}, deadline_s=1)) == []

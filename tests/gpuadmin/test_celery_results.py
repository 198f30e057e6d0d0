"""Results are kept only for the tasks whose answer a caller waits for: a message sent by name
and nobody waits on neither subscribes its sender to a result channel nor has its worker store
a result (``gpuadmin.celery.App.send_task``, ``CELERY_TASK_IGNORE_RESULT``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from gpuadmin.celery import app
from inventory import live


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue no worker consumes, emptied afterwards."""
    name = f"test-results-{os.getpid()}"
    yield name
    live.client().delete(name)


def subscriptions() -> set[bytes]:
    return set(app.backend.result_consumer.subscribed_to)


def sent_headers(queue: str) -> list[dict]:
    return [json.loads(message)["headers"] for message in live.client().lrange(queue, 0, -1)]


def test_a_message_sent_by_name_asks_for_no_result(queue: str) -> None:
    before = subscriptions()

    result = app.send_task("scheduling.placement_pass", queue=queue)

    assert subscriptions() == before, "the sender subscribed to a result nobody reads"
    [headers] = sent_headers(queue)
    assert headers["ignore_result"] is True  # the worker stores nothing either
    assert result.ignored


def test_a_caller_that_waits_asks_for_the_result(queue: str) -> None:
    result = app.send_task("inventory.scan_node", queue=queue, ignore_result=False)

    assert f"celery-task-meta-{result.id}".encode() in subscriptions()
    [headers] = sent_headers(queue)
    assert headers["ignore_result"] is False
    app.backend.result_consumer.cancel_for(result.id)


def test_only_the_tasks_whose_answer_is_awaited_store_one() -> None:
    app.loader.import_default_modules()
    answering = {
        name
        for name, task in app.tasks.items()
        if not name.startswith("celery.") and task.ignore_result is False
    }
    # inventory.services.run_on_node's tasks: a scan, a MIG change, a job's log.
    assert answering == {
        "inventory.scan_node",
        "inventory.mig_create",
        "inventory.mig_destroy",
        "scheduling.tail_log",
    }

"""The scheduling pages in real Chromium: submitting through the form, the queue's reasons
refreshed live, the job page's highlighted GPUs and its reload when the job is placed, and
both pages (and the dashboard naming the jobs on its GPUs) at laptop and wall-screen widths
in light and dark mode."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

from gpuadmin.celery import app
from scheduling.jobs import control, shape
from scheduling.models import Job, JobState
from tests.browser.conftest import ARTIFACTS_DIR
from tests.scheduling.pages.helpers import LOG_TEXT, AgentBroker, add_fleet, person, place, submit

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def agents(monkeypatch) -> AgentBroker:
    broker = AgentBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    return broker


def log_in(context, live_server, user) -> None:  # noqa: ANN001 - playwright BrowserContext
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    context.add_cookies(
        [{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}]
    )


def busy_queue() -> tuple[Job, Job]:
    """Two nodes with jobs on GPUs, jobs waiting for them and finished ones; returns a
    running job and a waiting one."""
    alice, bob = person("alice"), person("bob")
    add_fleet(2, live=True)
    pretrain = submit(alice, gpu_count=8, name="pretrain", project="llm", estimated_duration_s=3600)
    submit(bob, gpu_count=4, topology="nvlink", name="finetune", project="vision")
    submit(bob, gpu_count=2, name="eval", project="vision", estimated_duration_s=900)
    place()
    sweep = submit(alice, gpu_count=8, node_count=2, name="sweep", project="llm")
    submit(bob, gpu_count=4, topology="nvlink", name="finetune-2", project="vision")
    control.cancel_job(submit(alice, name="typo"), actor=alice)
    place(pretrain, sweep)
    return pretrain, sweep


def test_submitting_through_the_form_lands_on_the_job_page(page, live_server):
    alice = person("alice")
    add_fleet()
    log_in(page.context, live_server, alice)
    page.goto(live_server.url + "/jobs/new/")
    page.fill("#id_command", "python train.py --epochs 3")
    page.fill("#id_name", "finetune")
    page.fill("#id_gpu_count", "2")
    page.select_option("#id_topology", "nvlink")
    page.fill("#id_env", "SEED=1")
    page.get_by_role("button", name="Submit", exact=True).click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get()
    assert page.locator("h1").inner_text() == f"Job {job.pk}: finetune"
    assert page.locator(".message.success").inner_text() == f"Job {job.pk} submitted."
    assert page.locator("#job-live [data-state]").inner_text() == "queued"
    assert page.locator(".argv code").all_inner_texts() == ["python", "train.py", "--epochs", "3"]

    place(job)  # the status panel sees the new state and reloads the page
    page.locator(".job-topology").wait_for(timeout=10_000)
    assert page.locator("#job-live [data-state]").inner_text() == "scheduled"
    assert page.locator(".job-topology td.picked").count() == 4
    page.locator("#job-log pre").wait_for(timeout=5_000)
    assert page.locator("#job-log pre").inner_text() == LOG_TEXT


def test_a_form_error_shows_on_its_field(page, live_server):
    add_fleet()
    log_in(page.context, live_server, person("alice"))
    page.goto(live_server.url + "/jobs/new/")
    page.fill("#id_command", "python train.py")
    page.fill("#id_gpu_count", "9")
    page.get_by_role("button", name="Submit", exact=True).click()
    error = page.locator("#id_gpu_count-error")
    assert error.inner_text() == "9 GPUs per node, but no node has more than 8 GPUs"
    assert not Job.objects.exists()


def test_the_mig_profile_offers_the_profiles_of_the_pool_chosen(page, live_server):
    from inventory.models import Node, Pool
    from tests.inventory.pages import add_node, unique_host

    a100, h100 = unique_host(), unique_host()
    add_node(a100, "dgx-a100-40gb")
    add_node(h100, "dgx-h100")
    Node.objects.filter(hostname=h100).update(pool=Pool.objects.create(name="hopper"))
    shape.FleetShape.forget()
    log_in(page.context, live_server, person("alice"))
    page.goto(live_server.url + "/jobs/new/")

    def offered() -> list[str]:
        return page.evaluate(
            "() => { const list = document.getElementById('id_mig_profile').list;"
            " return list ? [...list.options].map(o => o.value) : []; }"
        )

    assert offered()[:2] == ["1g.5gb", "1g.5gb+me"]  # the A100 40GB's, in no pool
    assert "7g.40gb" in offered() and "7g.80gb" not in offered()
    page.select_option("#id_pool", "hopper")
    assert offered()[:2] == ["1g.10gb", "1g.10gb+me"]  # the H100's
    assert "7g.80gb" in offered() and "7g.40gb" not in offered()


def test_the_queue_says_why_a_job_waits_and_refreshes_live(page, live_server):
    running, waiting = busy_queue()
    log_in(page.context, live_server, running.owner)
    page.goto(live_server.url + "/jobs/")
    page.evaluate("window.__marker = 1")

    reason = page.locator(f"#job-{waiting.pk} td.reason")
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason in reason.inner_text()
    assert page.locator(f"#job-{waiting.pk} td").first.inner_text() == str(waiting.queue_position)
    assert page.locator(f"#job-{running.pk} td.gpus a").count() == 8

    late = submit(running.owner, name="late")
    page.locator(f"#job-{late.pk}").wait_for(timeout=10_000)  # the 2 s poll, no reload
    assert page.evaluate("window.__marker") == 1


def test_the_job_page_highlights_its_gpus_on_the_topology_matrix(page, live_server):
    alice = person("alice")
    (node,) = add_fleet()
    job = submit(alice, gpu_count=4, topology="nvlink", name="finetune", project="vision")
    place(job)
    log_in(page.context, live_server, alice)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")

    matrix = page.locator(f'[data-node="{node.hostname}"] table.topo')
    indexes = job.placement["nodes"][node.hostname]
    assert matrix.locator("thead th.picked").all_inner_texts() == [f"GPU{i}" for i in indexes]
    assert matrix.locator("td.picked").count() == 16
    picked = matrix.locator("td.picked").first.evaluate("e => getComputedStyle(e).outlineStyle")
    plain = matrix.locator("td.link:not(.picked)").first.evaluate(
        "e => getComputedStyle(e).outlineStyle"
    )
    assert (picked, plain) == ("solid", "none")
    assert page.locator(".placement .explanation").inner_text() == job.placement["explanation"]
    page.locator("#job-log pre").wait_for(timeout=5_000)


@pytest.mark.parametrize(
    ("width", "height", "scheme"),
    [(1366, 768, "light"), (2560, 1440, "dark")],
    ids=["laptop-light", "wall-dark"],
)
def test_queue_and_job_pages_fit_laptop_and_wall_screens(
    browser, live_server, width, height, scheme
):
    running, waiting = busy_queue()
    context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
    log_in(context, live_server, running.owner)
    page = context.new_page()
    try:
        pages = [("jobs", "/jobs/"), ("job", f"/jobs/{running.pk}/"), ("fleet-jobs", "/fleet/")]
        for name, path in pages:
            page.goto(live_server.url + path)
            assert page.evaluate("document.documentElement.scrollWidth") <= width, name
            for card in page.locator(".node-card").all():  # the GPUs' jobs fit their cards
                assert card.evaluate("e => e.scrollWidth <= e.clientWidth"), name
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            red, green, blue = map(int, re.findall(r"\d+", background)[:3])
            assert (max(red, green, blue) < 60) == (scheme == "dark"), background
            ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
            page.screenshot(
                path=str(ARTIFACTS_DIR / f"{name}-{width}-{scheme}.png"), full_page=True
            )
    finally:
        context.close()

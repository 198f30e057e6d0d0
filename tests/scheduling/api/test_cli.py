"""``gpuadmin token create`` and ``gpuadmin jobs ...`` against a live server, with a token."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from gpuadmin import cli, jobs_cli
from scheduling.allocations import manual
from scheduling.jobs import arrays
from scheduling.jobs.api.serializers import JobSubmitSerializer
from scheduling.loop import dispatch, switch
from scheduling.loop import passes as loop
from scheduling.models import Job, JobArray, JobState
from tests.scheduling.api.conftest import submit, write_log
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gpuadmin(live_server, capsys, monkeypatch, make_user):
    """``gpuadmin(*argv)`` -> (status, stdout, stderr), as alice, through the live server."""
    monkeypatch.setattr(dispatch, "wake", lambda: None)  # no placement pass on the shared Redis
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)  # pytest-django set it up
    make_user("alice")

    def run(*argv: str) -> tuple[int, str, str]:
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    status, key, note = run("token", "create", "laptop", "--user", "alice")
    assert status == 0 and key.startswith("gpa_")
    assert "shown only this once" in note
    monkeypatch.setenv("GPUADMIN_URL", live_server.url)
    monkeypatch.setenv("GPUADMIN_TOKEN", key.strip())
    return run


def test_token_for_an_unknown_user(gpuadmin):
    assert gpuadmin("token", "create", "ci", "--user", "nobody") == (
        1,
        "",
        "gpuadmin token create: no user 'nobody'\n",
    )


def test_submit_list_show_cancel(gpuadmin, fleet):
    status, out, _ = gpuadmin(
        "jobs", "submit", "--gpus", "8", "--name", "big", "--env", "A=1", "--", "python", "t.py"
    )
    assert status == 0
    job = Job.objects.get()
    assert (job.command, job.gpu_count, job.env, job.owner.username) == (
        ["python", "t.py"],
        8,
        {"A": "1"},
        "alice",
    )
    assert out.splitlines()[0] == f"job {job.pk} submitted: queued (8 GPUs x 1 node)"
    for _ in range(2):
        submit(job.owner, gpu_count=8)
    loop.run_pass()  # two jobs placed; the third (the newest) waits
    waiting = Job.objects.filter(state=JobState.QUEUED).get()

    status, out, _ = gpuadmin("jobs", "show", str(waiting.pk))
    assert status == 0
    assert "why pending: needs 8 free GPUs on one node; none is free (resources_busy)" in out
    assert "  position:    1" in out

    status, out, _ = gpuadmin("jobs", "list")
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "STATE",
        "PRIORITY",
        "GPUS",
        "OWNER",
        "NAME",
        "WHERE",
        "/",
        "WHY",
    ]
    assert len(lines) == 4
    assert f"{waiting.pk}" in lines[1] and "#1 needs 8 free GPUs" in lines[1]

    status, out, _ = gpuadmin("jobs", "cancel", str(waiting.pk))
    assert (status, out) == (0, f"job {waiting.pk} canceled\n")
    canceled = gpuadmin("jobs", "list", "--state", "canceled")[1].splitlines()
    assert [line.split()[:2] for line in canceled[1:]] == [[str(waiting.pk), "canceled"]]
    status, _, err = gpuadmin("jobs", "cancel", str(waiting.pk))
    assert (status, err) == (
        1,
        f"gpuadmin jobs cancel: HTTP 409: job {waiting.pk} is already canceled\n",
    )


EVERY_SUBMIT_OPTION = (
    *("--gpus", "2", "--nodes", "1", "--model", "NVIDIA A100-SXM4-80GB"),
    *("--min-memory-mib", "1024", "--topology", "nvlink", "--priority", "high"),
    *("--name", "train", "--project", "vision", "--max-runtime", "7200"),
    *("--estimated-duration", "3600", "--retries", "2", "--preemptible", "--env", "A=1"),
    *("--workdir", "/workspace", "--image", "nvcr.io/nvidia/pytorch:24.05-py3", "--hold"),
    *("--cpus", "16", "--mem", "64G"),
)


def test_submit_takes_every_field_of_the_api(gpuadmin, fleet):
    status, _, err = gpuadmin("jobs", "submit", *EVERY_SUBMIT_OPTION, "--", "python", "t.py")
    assert status == 0, err
    job = Job.objects.get()
    assert (job.estimated_duration_s, job.working_dir, job.container_image) == (
        3600,
        "/workspace",
        "nvcr.io/nvidia/pytorch:24.05-py3",
    )
    assert (job.preemptible, job.max_runtime_s, job.max_retries, job.priority) == (
        True,
        7200,
        2,
        "high",
    )
    assert (job.state, job.topology, job.project) == (JobState.PENDING, "nvlink", "vision")
    assert (job.cpus, job.host_memory_mib) == (16, 64 * 1024)


def test_submit_with_an_idempotency_key_stores_one_job(gpuadmin, fleet):
    """A resend of ``--idempotency-key`` (a quote in it: the header's escapes) is the job the
    first stored."""
    argv = ("jobs", "submit", "--idempotency-key", 'run "7"', "--", "true")
    first, again = gpuadmin(*argv), gpuadmin(*argv)
    job = Job.objects.get()
    assert first[0] == again[0] == 0
    assert first[1] == again[1] and first[1].startswith(f"job {job.pk} submitted: queued")
    assert job.idempotency_key == 'run "7"'
    with pytest.raises(SystemExit) as usage:
        gpuadmin("jobs", "submit", "--idempotency-key", "clé", "--", "true")
    assert usage.value.code == 2


# Options the live server would refuse together (a MIG device and an MPS share, in pools
# and a reservation the test fleet lacks): only sent.
SHARING_OPTIONS = (
    *("--pool", "a100", "--mig", "1g.10gb", "--mps", "25", "--mps-memory", "8000"),
    *("--reservation", "7", "--dependency", "afterok:1", "--array", "0-3%2"),
)


def test_submit_sends_every_field_the_api_takes(monkeypatch):
    """A field added to the submit API needs its option in ``gpuadmin jobs submit``."""
    sent = {}

    def call(api, method, path, body=None, **params):
        sent.update(body)
        return {"id": 1, "size": 4, "max_running": 2, "state": "queued", "tasks_url": "/"}

    monkeypatch.setattr(jobs_cli.Api, "call", call)
    argv = [
        *("jobs", "submit", *EVERY_SUBMIT_OPTION, *SHARING_OPTIONS),
        *("--ray", "--shell", "--", "true"),
    ]
    assert cli.main(argv) == 0
    assert set(sent) == set(JobSubmitSerializer().fields)
    assert (sent["mig_profile"], sent["mps_percent"], sent["array"]) == ("1g.10gb", 25, "0-3%2")


def test_arrays_and_dependencies(gpuadmin, fleet):
    status, out, err = gpuadmin("jobs", "submit", "--array", "0-3%2", "--", "python", "t.py")
    assert status == 0, err
    array = JobArray.objects.get()
    assert out.splitlines() == [
        f"array {array.pk} submitted: 4 tasks, at most 2 at once (queued)",
        f"  gpuadmin jobs array {array.pk}   # its tasks by state",
        f"  gpuadmin jobs list --array {array.pk}   # its tasks, each a job once the placement "
        "loop reaches it",
    ]
    arrays.split_due()  # as the placement loop does: its cap and one more
    tasks = list(Job.objects.filter(array=array).order_by("array_index"))
    status, out, err = gpuadmin(
        "jobs", "submit", "--dependency", f"afterok:{tasks[0].pk}", "--mig", "1g.10gb", "--", "true"
    )
    assert status == 0, err
    dependent = Job.objects.latest("pk")
    assert out.splitlines()[0] == f"job {dependent.pk} submitted: queued (MIG device 1g.10gb)"
    out = gpuadmin("jobs", "show", str(dependent.pk))[1]
    assert f"  depends on:  afterok:{tasks[0].pk} (queued, pending)" in out
    out = gpuadmin("jobs", "show", str(tasks[1].pk))[1]
    assert f"  array:       {array.pk}, task 1" in out
    status, out, _ = gpuadmin("jobs", "array", str(array.pk))
    assert out.splitlines() == [
        f"array {array.pk} [0-3%2] (alice): 4 tasks, at most 2 at once",
        "  queued:    4",
        f"  gpuadmin jobs list --array {array.pk}   # the tasks made jobs so far (1 to come as "
        "the placement loop reaches them)",
    ]
    listed = gpuadmin("jobs", "list", "--array", str(array.pk))[1].splitlines()
    assert len(listed) == 4 and f"({array.pk}_2)" in listed[1]
    status, out, _ = gpuadmin("jobs", "array", str(array.pk), "--cancel")
    assert out == (
        f"array {array.pk}: 4 tasks canceled (1 of them not made jobs yet), 0 stopping through "
        "their agents\n"
    )
    status, _, err = gpuadmin("jobs", "submit", "--array", "0-99999", "--", "true")
    assert (status, err) == (
        1,
        "gpuadmin jobs submit: HTTP 400: array: more than 10000 tasks; submit several arrays\n",
    )
    # A blank --array is no array (the server's reading): one job, said as one.
    status, out, err = gpuadmin("jobs", "submit", "--array", "   ", "--", "true")
    assert status == 0, err
    assert out.startswith(f"job {Job.objects.latest('pk').pk} submitted: queued")


def test_cancel_tasks_hold_and_release_an_array_as_slurm_users_do(gpuadmin, fleet, capsys):
    """``gpuadmin jobs cancel 12_5`` and ``12_[3-7]`` as scancel, ``jobs array ID --hold``
    and ``--release`` as scontrol."""
    gpuadmin("jobs", "submit", "--array", "0-9%2", "--", "true")
    array = JobArray.objects.get()
    arrays.split_due()  # indexes 0-2 made jobs, 3-9 to come
    status, out, err = gpuadmin("jobs", "cancel", f"{array.pk}_[2-4,8]")
    assert (status, out) == (
        0,
        f"array {array.pk}: 4 tasks canceled (3 of them not made jobs yet), 0 stopping through "
        "their agents\n",
    ), err
    status, out, _ = gpuadmin("jobs", "cancel", f"{array.pk}_1", "--json")
    made = Job.objects.get(array=array, array_index=1)
    assert json.loads(out) == {"canceled": [made.pk], "canceling": [], "unsplit": 0}
    status, _, err = gpuadmin("jobs", "cancel", f"{array.pk}_[5-12]")
    assert (status, err) == (
        1,
        f"gpuadmin jobs cancel: HTTP 400: tasks: array {array.pk} [0-9%2] has no task 10-12\n",
    )
    with pytest.raises(SystemExit):
        gpuadmin("jobs", "cancel", f"{array.pk}_x")
    assert "an array's task (12_5) or tasks (12_[3-7,9])" in capsys.readouterr().err
    status, out, _ = gpuadmin("jobs", "array", str(array.pk), "--hold")
    assert out == (
        f"array {array.pk} held: 1 job now pending, its 4 tasks not made jobs yet to come pending\n"
    )
    status, out, _ = gpuadmin("jobs", "array", str(array.pk))
    assert "  pending:   5\n  canceled:  5\n" in out
    status, out, _ = gpuadmin("jobs", "array", str(array.pk), "--release")
    assert out == (
        f"array {array.pk} released: 1 job now queued, its 4 tasks not made jobs yet to come "
        "queued\n"
    )
    status, _, err = gpuadmin("jobs", "array", str(array.pk), "--release")
    assert (status, err) == (
        1,
        f"gpuadmin jobs array: HTTP 409: array {array.pk} has no held task to release\n",
    )


def test_show_says_what_a_waiting_job_waits_for(gpuadmin, fleet):
    """A job held back by its dependency, then by a stopped scheduler: never "the scheduler
    has not looked at it yet" once a pass has run."""
    first = Job.objects.get(pk=submit_job(gpuadmin, "--gpus", "8"))
    dependent = submit_job(gpuadmin, "--dependency", f"afterok:{first.pk}")
    loop.run_pass()
    out = gpuadmin("jobs", "show", str(dependent))[1]
    assert f"  why pending: waiting for job {first.pk} to complete (afterok) (dependency)\n" in out
    switch.set_scheduler_enabled(False, actor=first.owner)
    loop.run_pass()
    out = gpuadmin("jobs", "show", str(dependent))[1]
    assert "  why pending: the scheduler is stopped: nothing is placed until an admin" in out


def submit_job(gpuadmin, *options: str) -> int:
    status, _, err = gpuadmin("jobs", "submit", *options, "--", "true")
    assert status == 0, err
    return Job.objects.latest("pk").pk


def test_model_by_a_part_of_its_name(gpuadmin, fleet):
    """``--model H100`` is the fleet's "NVIDIA H100 80GB HBM3" (as the GPU filter matches);
    a part that several models share is refused with the candidates."""
    add_sim_node("dgx-h100-01", "dgx-h100")
    add_sim_node("dgx-a100-40", "dgx-a100-40gb")
    job = Job.objects.get(pk=submit_job(gpuadmin, "--model", "H100"))
    assert job.gpu_model == "NVIDIA H100 80GB HBM3"
    status, _, err = gpuadmin("jobs", "submit", "--model", "A100", "--", "true")
    assert (status, err) == (
        1,
        "gpuadmin jobs submit: HTTP 400: gpu_model: 'A100' matches NVIDIA A100-SXM4-40GB, "
        "NVIDIA A100-SXM4-80GB\n",
    )


def test_submit_refused_names_the_field(gpuadmin, fleet):
    status, out, err = gpuadmin("jobs", "submit", "--gpus", "9", "--", "true")
    assert (status, out) == (1, "")
    assert err == (
        "gpuadmin jobs submit: HTTP 400: gpu_count: 9 GPUs per node, but no node has more "
        "than 8 GPUs\n"
    )
    for array in ((), ("--array", "0-9")):
        status, out, err = gpuadmin(
            "jobs", "submit", "--gpus", "8", "--topology", "numa", *array, "--", "true"
        )
        assert (status, out) == (1, "")
        assert err == (
            "gpuadmin jobs submit: HTTP 400: topology: needs 8 GPUs in one NUMA node; the "
            "largest NUMA node has 2\n"
        )
    assert not Job.objects.exists()


def test_shell_command(gpuadmin, fleet):
    assert gpuadmin("jobs", "submit", "--shell", "--", "echo $HOME &&", "ls")[0] == 0
    job = Job.objects.get()
    assert (job.command, job.use_shell) == (["echo $HOME && ls"], True)


def test_bad_token(gpuadmin, monkeypatch, db):
    monkeypatch.setenv("GPUADMIN_TOKEN", "gpa_wrong")
    status, _, err = gpuadmin("jobs", "list")
    assert status == 1
    assert err.startswith("gpuadmin jobs list: HTTP 401: Invalid or revoked API token.")


def test_log_and_follow(gpuadmin, fleet, agent_broker, monkeypatch, django_user_model):
    job = submit(django_user_model.objects.get(username="alice"))
    gpu = fleet[0].gpus.get(index=0)
    manual.allocate_by_hand(job, [gpu.uuid], actor=job.owner)
    job.refresh_from_db()
    write_log(job, "one\ntwo\nthr")
    status, out, _ = gpuadmin("jobs", "log", str(job.pk), "--tail", "2")
    assert (status, out) == (0, "two\nthr")

    polls = []

    def next_poll(seconds: float) -> None:  # the job writes more between polls, then ends
        polls.append(seconds)
        if len(polls) == 1:
            write_log(job, "one\ntwo\nthree\nfour\n")
        else:
            write_log(job, "one\ntwo\nthree\nfour\nfive")
            Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)

    monkeypatch.setattr(jobs_cli.time, "sleep", next_poll)
    status, out, _ = gpuadmin("jobs", "log", str(job.pk), "--tail", "1", "--follow")
    assert (status, out, polls) == (0, "two\nthree\nfour\nfive", [2.0, 2.0])


def test_new_lines():
    assert jobs_cli.new_lines(["a\n", "b\n"], ["a\n", "b\n", "c\n"]) == ["c\n"]
    assert jobs_cli.new_lines(["a\n", "b\n", "c\n"], ["b\n", "c\n", "d\n"]) == ["d\n"]
    assert jobs_cli.new_lines(["a\n"], ["a\n"]) == []
    assert jobs_cli.new_lines(["a\n"], ["x\n", "y\n"]) == ["x\n", "y\n"]


def test_a_held_job_is_released_held_again_and_shown_with_what_it_may_suffer(gpuadmin, fleet):
    status, out, err = gpuadmin("jobs", "submit", "--hold", "--preemptible", "--", "true")
    assert status == 0, err
    job = Job.objects.get()
    assert gpuadmin("jobs", "release", str(job.pk))[:2] == (0, f"job {job.pk} released: queued\n")
    status, _, err = gpuadmin("jobs", "release", str(job.pk))
    assert status == 1 and "HTTP 409" in err
    assert gpuadmin("jobs", "hold", str(job.pk))[:2] == (0, f"job {job.pk} held: pending\n")
    status, _, err = gpuadmin("jobs", "hold", str(job.pk))
    assert status == 1 and f"HTTP 409: job {job.pk} is pending, not queued" in err
    assert gpuadmin("jobs", "release", str(job.pk))[:2] == (0, f"job {job.pk} released: queued\n")
    Job.objects.filter(pk=job.pk).update(preemptions=2, failures=1, max_retries=3)
    out = gpuadmin("jobs", "show", str(job.pk))[1]
    assert "  preemptible: yes\n" in out
    assert "  preempted:   2 times, re-queued each time\n" in out
    assert "  failed runs: 1 (it is run again at most 3 times)\n" in out
    Job.objects.filter(pk=job.pk).update(preemptions=1, max_retries=1)
    out = gpuadmin("jobs", "show", str(job.pk))[1]
    assert "  needs:       1 GPU x 1 node\n" in out  # not "1 GPU(s) x 1 node(s)"
    assert "  preempted:   1 time, re-queued each time\n" in out  # not "1 times"
    assert "  failed runs: 1 (it is run again at most 1 time)\n" in out


class OtherServer:
    """A real HTTP server that is not gpuadmin: it answers every request with ``answer``
    (status, headers, body) and keeps what it was sent."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def handle_one(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = handle_one

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def other_servers():
    started: list[OtherServer] = []

    def start(status: int, headers: dict[str, str], body: bytes = b"") -> OtherServer:
        started.append(OtherServer(status, headers, body))
        return started[-1]

    yield start
    for server in started:
        server.close()


def test_an_answer_that_is_not_gpuadmin_is_one_line_and_no_traceback(
    gpuadmin, monkeypatch, other_servers
):
    page = b"<!doctype html>\n<html><title>Sign in</title>\n<body>\n<p>proxy</p></body></html>"
    for status, headers, body, said in (
        (200, {"Content-Type": "text/html"}, page, "answered text/html, not as gpuadmin's API"),
        (200, {"Content-Type": "application/json"}, b'{"hello": "world"}', "not as gpuadmin"),
        (500, {"Content-Type": "text/html"}, page, "HTTP 500: Sign in proxy (is GPUADMIN_URL"),
        (404, {}, b"", "HTTP 404: no reason given"),
    ):
        monkeypatch.setenv("GPUADMIN_URL", other_servers(status, headers, body).url)
        for argv in (("list",), ("show", "1"), ("submit", "--", "true"), ("cancel", "1")):
            code, _, err = gpuadmin("jobs", *argv)
            assert code == 1 and said in err and err.count("\n") == 1, (argv, err)


def test_a_redirect_is_reported_and_never_followed_with_the_token(
    gpuadmin, monkeypatch, other_servers
):
    elsewhere = other_servers(200, {"Content-Type": "application/json"}, b"{}")
    mover = other_servers(301, {"Location": elsewhere.url + "/queue/submit"})
    monkeypatch.setenv("GPUADMIN_URL", mover.url)
    code, _, err = gpuadmin("jobs", "submit", "--", "true")
    assert code == 1
    assert err == (
        f"gpuadmin jobs submit: HTTP 301: redirected to {elsewhere.url}/queue/submit "
        "(is GPUADMIN_URL the gpuadmin server's address?)\n"
    )
    assert [method for method, _, _ in mover.seen] == ["POST"] and elsewhere.seen == []


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("GPUADMIN_URL", "http://127.0.0.1:abc", "cannot reach http://127.0.0.1:abc: "),
        ("GPUADMIN_URL", "http://[::1", "cannot reach http://[::1: Invalid IPv6 URL"),
        ("GPUADMIN_URL", "http://exa mple.com", "cannot reach http://exa mple.com: "),
        ("GPUADMIN_TOKEN", "gpa_x\ny", "GPUADMIN_TOKEN is not a token"),
        ("GPUADMIN_TOKEN", "gpa_é中", "GPUADMIN_TOKEN is not a token"),
        ("GPUADMIN_TOKEN", "garbage", "HTTP 401: Not an API token: they begin gpa_"),
    ],
)
def test_a_bad_address_or_token_is_one_clear_line(gpuadmin, monkeypatch, variable, value, said):
    monkeypatch.setenv(variable, value)
    code, _, err = gpuadmin("jobs", "list")
    assert code == 1 and said in err and err.count("\n") == 1, err


def test_nested_refusals_name_their_part_and_release_says_why(gpuadmin, fleet):
    code, _, err = gpuadmin("jobs", "submit", "--env", "A=" + "x" * 40000, "--", "true")
    assert (code, err) == (
        1,
        "gpuadmin jobs submit: HTTP 400: env.A: "
        "Ensure this field has no more than 32768 characters.\n",
    )
    gpuadmin("jobs", "submit", "--", "true")
    job = Job.objects.get()
    assert gpuadmin("jobs", "release", str(job.pk))[2] == (
        f"gpuadmin jobs release: HTTP 409: job {job.pk} is queued, not pending\n"
    )
    out = gpuadmin("jobs", "show", str(job.pk))[1]
    assert "preempted" not in out and "failed runs" not in out  # none yet: not shown as 0


def test_a_log_tail_is_a_count_of_lines(gpuadmin, capsys):
    with pytest.raises(SystemExit) as usage:
        gpuadmin("jobs", "log", "1", "--tail", "-1")
    assert usage.value.code == 2
    assert "argument --tail: -1: a number of lines, 0 or more" in capsys.readouterr().err


def test_the_cli_and_the_server_agree_on_their_headers():
    from gpuadmin import client, request_id

    assert client.SERVER_HEADER == request_id.HEADER  # the server always sends it
    assert client.CHANNEL_HEADER == request_id.CHANNEL_HEADER  # the CLI names its verb


def test_following_a_job_that_has_not_run_says_why_nothing_shows(gpuadmin, fleet, monkeypatch):
    gpuadmin("jobs", "submit", "--hold", "--", "true")
    job = Job.objects.get()

    def canceled_meanwhile(seconds: float) -> None:
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELED)

    monkeypatch.setattr(jobs_cli.time, "sleep", canceled_meanwhile)
    status, out, err = gpuadmin("jobs", "log", str(job.pk), "--follow")
    assert (status, out) == (0, "")
    assert err == f"job {job.pk} is pending: its log shows here once it runs\n"


def test_a_viewer_is_shown_no_command_and_no_log_of_anothers_job(
    gpuadmin, fleet, agent_broker, make_user, monkeypatch
):
    """GPUADMIN_PRIVATE_DATA's default, through the API: alice's job is hers."""
    gpuadmin("jobs", "submit", "--", "train.py", "--password", "hunter2")
    job = Job.objects.get()
    manual.allocate_by_hand(job, [fleet[0].gpus.get(index=0).uuid], actor=job.owner)
    job.refresh_from_db()
    write_log(job, "ALICE-LOG-SECRET\n")
    make_user("vic", "viewer")
    key = gpuadmin("token", "create", "laptop", "--user", "vic")[1]
    monkeypatch.setenv("GPUADMIN_TOKEN", key.strip())

    status, out, _ = gpuadmin("jobs", "show", str(job.pk))
    assert status == 0 and "  command:     (hidden)\n" in out and "hunter2" not in out
    for follow in ((), ("--follow",)):
        status, out, err = gpuadmin("jobs", "log", str(job.pk), *follow)
        assert (status, out) == (1, "")
        assert err == (
            f"gpuadmin jobs log: HTTP 403: The log of job {job.pk} is private to its owner "
            "and admins.\n"
        )

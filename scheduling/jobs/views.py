"""Scheduling pages: the queue, a job's page (status, timeline, placement on the topology
matrix, allocations, log tail), the submit form and the cancel actions (a job, an array).

The queue lists everyone's jobs (like ``squeue``: no commands, no environments); a job's own
page follows the API's rule (``queries.visible_jobs``: users read their own jobs, viewers,
operators and admins every job), its command and log only for those
``gpuadmin.access.services.can_read_private`` lets read them. Submitting needs the user
role, cancelling ``gpuadmin.access.services.can_act_on``. Live regions are
``{% partialdef %}`` blocks the same view renders alone for HTMX requests (not boosted ones),
polled every 2 s while the tab is visible.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRefresh

from gpuadmin import throttling
from gpuadmin.access.permissions import check_can_read_private, signed_in
from gpuadmin.access.services import can_act_on, can_submit
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from inventory.pages.sections import requested_sections
from scheduling.filters import JobFilterSet
from scheduling.jobs import control, limits, pages, queries, slurm, submission, transitions
from scheduling.jobs.forms import SubmitJobForm
from scheduling.models import Job
from scheduling.placement.text import plural


def _job(request: HttpRequest, pk: int) -> Job:
    """The job, if ``request.user`` may read it (as in the API); 404 otherwise."""
    return get_object_or_404(
        queries.visible_jobs(signed_in(request)).select_related(
            "owner", "pool", "array", "reservation"
        ),
        pk=pk,
    )


@login_required
@require_GET
@vary_on_headers("HX-Request")
def queue(request: HtmxHttpRequest) -> HttpResponse:
    """Waiting jobs in queue order with their reasons, jobs on GPUs, the latest finished, and
    the sections apps above scheduling add (``gpuadmin.registry.page_sections``, page "jobs")."""
    # The API's FilterSet: a query string selects the same jobs here and in /api/v1/jobs/,
    # among everyone's jobs (like ``squeue``: the rows show no command or environment).
    filterset = JobFilterSet(
        request.GET, queryset=Job.objects.select_related("owner"), request=request
    )
    # One row per array's waiting tasks, unless the query asks for one array's tasks.
    shown = pages.queue(
        filterset.qs, signed_in(request), collapse_arrays=not request.GET.get("array")
    )
    context = {"queue": shown, "filterset": filterset}
    if htmx_partial(request):
        return render(request, "scheduling/queue.html#queue-live", context)
    # The sections apps above scheduling add (Slurm's jobs) come with the page, not the poll.
    context.update(
        can_submit=can_submit(request.user), sections=requested_sections("jobs", None, request)
    )
    return render(request, "scheduling/queue.html", context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def job_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A job's facts and status ("why is it waiting?"), timeline, allocations, placement on
    its nodes' topology matrices and log tail. The status panel polls; when the state moved
    on from the one the page shows (``?shown=``), the whole page reloads."""
    job = _job(request, pk)
    if htmx_partial(request):
        if request.GET.get("shown") != job.state:
            return HttpResponseClientRefresh()
        return render(request, "scheduling/job_detail.html#job-live", {"page": pages.JobPage(job)})
    return render(
        request, "scheduling/job_detail.html", {"page": pages.job_page(job, signed_in(request))}
    )


@login_required
@require_GET
def job_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The log tail partial (``?node=`` for another node of a multi-node job); 403 to those
    it is private from."""
    job = _job(request, pk)
    check_can_read_private(request, job, f"log of job {job.pk}")
    tail = pages.log_tail(job, request.GET.get("node", ""))
    return render(request, "scheduling/job_detail.html#job-log", {"tail": tail})


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    """Cancel through ``control.cancel_job`` (owner, operators, admins); back to the job."""
    job = _job(request, pk)
    if not can_act_on(request.user, job):
        raise PermissionDenied("Only the job's owner, operators and admins can cancel it.")
    try:
        control.cancel_job(job, actor=signed_in(request))
    except transitions.IllegalTransition:
        messages.error(
            request, f"Job {job.pk} is {job.get_state_display().lower()}: nothing to cancel."
        )
    else:
        if job.is_terminal:
            messages.success(request, f"Job {job.pk} canceled.")
        else:
            messages.success(request, f"Cancel requested: the agents are stopping job {job.pk}.")
    return redirect("scheduling:job-detail", pk=job.pk)


@login_required
@require_POST
def job_release(request: HttpRequest, pk: int) -> HttpResponse:
    """Let a held job into the queue through ``control.release_job`` (owner, operators,
    admins; Slurm's ``scontrol release``); back to the job."""
    job = _job(request, pk)
    if not can_act_on(request.user, job):
        raise PermissionDenied("Only the job's owner, operators and admins can release it.")
    try:
        control.release_job(job, actor=signed_in(request))
    except transitions.IllegalTransition:
        messages.error(request, f"Job {job.pk} is {job.get_state_display().lower()}: not held.")
    else:
        messages.success(request, f"Job {job.pk} released: it waits in the queue.")
    return redirect("scheduling:job-detail", pk=job.pk)


@login_required
@require_POST
def array_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    """Cancel an array's unfinished tasks through ``control.cancel_array`` (Slurm's
    ``scancel`` of an array: owner, operators, admins); on to the queue of its tasks."""
    array = get_object_or_404(queries.visible_arrays(signed_in(request)), pk=pk)
    if not can_act_on(request.user, array):
        raise PermissionDenied("Only the array's owner, operators and admins can cancel it.")
    outcome = control.cancel_array(array, actor=signed_in(request))
    messages.success(
        request,
        f"Array {array.pk}: {plural(len(outcome.canceled) + outcome.unsplit, 'task')} "
        f"canceled{slurm.unsplit_text(outcome.unsplit)}, {len(outcome.canceling)} being stopped by "
        "their agents.",
    )
    return redirect(f"{reverse('scheduling:queue')}?array={array.pk}")


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    """The submit form; the service's refusals show on the field they name."""
    if not can_submit(request.user):
        raise PermissionDenied("Viewers cannot submit jobs.")
    form = SubmitJobForm(
        request.POST if request.method == "POST" else None, user=signed_in(request)
    )
    wait = throttling.hit("submit", request.user) if request.method == "POST" else None
    if wait is not None:
        seconds = throttling.retry_after(wait)
        form.full_clean()  # keep what was typed, with the reason above it
        form.add_error(None, f"Too many submissions: try again in {seconds} s.")
        response = render(request, "scheduling/job_new.html", {"form": form}, status=429)
        response["Retry-After"] = seconds
        return response
    if form.is_valid():
        try:
            submitted = submission.submit(signed_in(request), **form.submission())
        except limits.JobRejected as exc:
            form.add_rejection(exc)
        else:
            if isinstance(submitted, submission.SubmittedArray):
                array = submitted.array
                messages.success(
                    request,
                    f"Array {array.pk} submitted: {plural(array.size, 'task')}, each a job "
                    "once the placement loop reaches it.",
                )
                return redirect(f"{reverse('scheduling:queue')}?array={array.pk}")
            messages.success(request, f"Job {submitted.pk} submitted.")
            return redirect("scheduling:job-detail", pk=submitted.pk)
    return render(request, "scheduling/job_new.html", {"form": form})

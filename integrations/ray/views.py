"""Ray pages: the registered clusters with the jobs the requester sees, the submit form, a
job's page (state, Ray's message, times, request, log) and its cancel action.

Who sees what is the API's rule (``services.visible_jobs``); a job's entrypoint, environment
and log only for those ``gpuadmin.access.services.can_read_private`` lets read them.
Submitting needs the user role, cancelling ``can_act_on``. The cluster list and a job's status
are ``{% partialdef %}`` blocks the same view renders alone for HTMX requests, polled while the
tab is visible; they read what the poll stored, so an unreachable cluster shows as its state."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRefresh

from gpuadmin.access.permissions import check_can_read_private, signed_in
from gpuadmin.access.services import can_act_on, can_submit
from gpuadmin.htmx import HtmxHttpRequest, htmx_partial
from integrations.ray import pages, services
from integrations.ray.forms import RayJobForm
from integrations.ray.jobs_api import RayError
from integrations.ray.models import RayCluster, RayJob


def _job(request: HttpRequest, pk: int) -> RayJob:
    """The job, if ``request.user`` sees it (as in the API); 404 otherwise."""
    return get_object_or_404(services.visible_jobs(signed_in(request)), pk=pk)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def clusters(request: HtmxHttpRequest) -> HttpResponse:
    """Each registered cluster's state, GPUs (total and in use) and nodes, and the newest Ray
    jobs the requester sees."""
    context = {
        "ray_clusters": RayCluster.objects.all(),
        **pages.jobs_context(signed_in(request)),
        "can_submit": can_submit(request.user),
    }
    if htmx_partial(request):
        return render(request, "ray/clusters.html#ray-live", context)
    return render(request, "ray/clusters.html", context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def job_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A Ray job's state, Ray's message (a queued job's reason), times, request and log. The
    status panel polls while the job is active; when its state moved on from the one the page
    shows (``?shown=``), the whole page reloads."""
    job = _job(request, pk)
    page = pages.job_page(job, signed_in(request))
    if htmx_partial(request):
        if request.GET.get("shown") != job.state:
            return HttpResponseClientRefresh()
        return render(request, "ray/job_detail.html#ray-job-live", {"page": page})
    return render(request, "ray/job_detail.html", {"page": page})


@login_required
@require_GET
def job_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The log's last lines (a partial); 403 to those it is private from."""
    job = _job(request, pk)
    check_can_read_private(request, job, f"log of Ray job {job.pk}")
    return render(request, "ray/job_detail.html#ray-job-log", {"tail": pages.log_tail(job)})


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    """Ask Ray to stop the job through ``services.cancel`` (owner, operators, admins)."""
    job = _job(request, pk)
    if not can_act_on(request.user, job):
        raise PermissionDenied("Only its owner, operators and admins cancel a Ray job.")
    try:
        services.cancel(actor=signed_in(request), job=job)
    except services.RayJobConflict as exc:
        messages.error(request, str(exc))
    except RayError as exc:
        messages.error(request, f"The cluster did not take the cancel: {exc}. Try again.")
    else:
        if job.active:
            messages.success(request, f"Cancel requested: Ray is stopping job {job.pk}.")
        else:
            messages.success(request, f"Ray job {job.pk} canceled.")
    return redirect("ray:job-detail", pk=job.pk)


@login_required
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    """The submit form (``?cluster=`` picks one); the service's refusals show on the field they
    name."""
    if not can_submit(request.user):
        raise PermissionDenied("Viewers cannot submit jobs.")
    initial = {"cluster": request.GET.get("cluster")} if request.method == "GET" else None
    form = RayJobForm(request.POST if request.method == "POST" else None, initial=initial)
    if form.is_valid():
        try:
            job = services.submit(owner=signed_in(request), **form.submission())
        except services.RayJobRefused as exc:
            form.add_refusal(exc)
        else:
            messages.success(request, f"Ray job {job.pk} submitted to {job.cluster.name}.")
            return redirect("ray:job-detail", pk=job.pk)
    return render(request, "ray/job_new.html", {"form": form})

"""Reading a Ray cluster and running jobs on it through Ray's Jobs API, under gpuadmin's rules:
who may submit (the roles), the quotas of the cluster's pool (``quotas.quota_refusal``, the
placement loop's rule; ``usage`` counts the jobs' GPUs in them and in fair share), and an audit
row for every submission, cancel request and change of state.

A submission is stored first (state ``pending``, with the ``submission_id`` gpuadmin chose),
then sent; a send that gets no answer is retried by the poll with the same id, and a send Ray
refuses is checked against Ray's own list, so a retried submission never starts two jobs."""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from gpuadmin.access.models import Role
from gpuadmin.access.services import at_least, can_act_on, visible_to
from gpuadmin.audit.services import changed_values, record
from gpuadmin.refusals import FieldRefusal
from integrations.ray.jobs_api import (
    ClusterView,
    JobInfo,
    PollAnswer,
    RayError,
    RayJobsClient,
    RayRefused,
    RayUnreachable,
    answer_or_error,
    ask_all,
)
from integrations.ray.models import (
    ACTIVE_STATES,
    RAY_STATES,
    ClusterState,
    RayCluster,
    RayJob,
    RayJobState,
)
from scheduling.policies.quotas import lock_holders, quota_refusal

logger = logging.getLogger(__name__)

POLL_ACTOR = "ray-poll"


class RayJobRefused(FieldRefusal):
    """A submission gpuadmin refuses before asking Ray (quota, cluster)."""


class RayJobConflict(Exception):
    """An action the job's state does not allow (cancel of an ended job)."""


def client_for(cluster: RayCluster) -> RayJobsClient:
    return RayJobsClient(cluster.address, cluster.token, timeout_s=settings.GPUADMIN_RAY_TIMEOUT_S)


CLUSTER_FIELDS = ("name", "address", "pool")


def _cluster_fields(cluster: RayCluster, token_changed: bool = False) -> dict[str, Any]:
    fields = {name: getattr(cluster, name) for name in CLUSTER_FIELDS}
    fields["pool"] = cluster.pool.name if cluster.pool else None
    return {**fields, "token": "changed"} if token_changed else fields


def save_cluster(cluster: RayCluster, *, actor: User) -> RayCluster:
    """Register a cluster or change one (audited ``ray.cluster_registered`` or
    ``ray.cluster_changed``, before and after; the token only as "changed"), then read it."""
    with transaction.atomic():
        old = RayCluster.objects.select_for_update().filter(pk=cluster.pk).first()
        cluster.full_clean()
        cluster.save()
        if old is None:
            after = _cluster_fields(cluster, token_changed=bool(cluster.token))
            record("ray.cluster_registered", actor=actor, target=cluster, after=after)
        else:
            before, after = changed_values(
                _cluster_fields(old), _cluster_fields(cluster, cluster.token != old.token)
            )
            if after:
                record(
                    "ray.cluster_changed", actor=actor, target=cluster, before=before, after=after
                )
    return read_cluster(cluster)


def delete_cluster(cluster: RayCluster, *, actor: User) -> None:
    """Forget a cluster that has no jobs (audited ``ray.cluster_deleted``)."""
    with transaction.atomic():
        record("ray.cluster_deleted", actor=actor, target=cluster, before=_cluster_fields(cluster))
        cluster.delete()


READ_FIELDS = [
    "state",
    "last_error",
    "ray_version",
    "nodes",
    "gpus",
    "gpus_in_use",
    "last_read_at",
    "last_ok_at",
]


def read_cluster(cluster: RayCluster) -> RayCluster:
    """Read the cluster's nodes and resources and store them (``store_read``)."""
    return store_read(cluster, answer_or_error(client_for(cluster).cluster))


def store_read(cluster: RayCluster, view: ClusterView | RayError) -> RayCluster:
    """Store what a read of the cluster found; a cluster that did not answer, or refused,
    keeps its last nodes and says why in ``state`` and ``last_error``."""
    now = timezone.now()
    if isinstance(view, RayRefused):
        cluster.state, cluster.last_error = ClusterState.REFUSED, str(view)
    elif isinstance(view, RayError):
        cluster.state, cluster.last_error = ClusterState.UNREACHABLE, str(view)
    else:
        alive = view.alive
        cluster.state, cluster.last_error = ClusterState.OK, ""
        cluster.ray_version = view.ray_version
        cluster.nodes = [asdict(node) for node in view.nodes]
        cluster.gpus = sum(node.gpus for node in alive)
        cluster.gpus_in_use = sum(node.gpus_in_use for node in alive)
        cluster.last_ok_at = now
    cluster.last_read_at = now
    cluster.save(update_fields=READ_FIELDS)  # an admin's edit meanwhile stays
    return cluster


def submit(
    *,
    owner: User,
    cluster: RayCluster,
    entrypoint: str,
    runtime_env: dict[str, Any] | None = None,
    gpus: float = 0,
    cpus: float = 0,
) -> RayJob:
    """Store the job under a new submission id (audited), then send it to Ray."""
    if not at_least(owner, Role.USER):
        raise PermissionDenied("Submitting a Ray job needs the user role.")
    if not entrypoint.strip():
        raise RayJobRefused("entrypoint", "Give the command Ray runs.")
    with transaction.atomic():
        # Ray decides when the job runs, so gpuadmin's quotas are weighed now, with what the
        # owner holds (their Ray jobs that have not ended included), one submission at a time.
        if cluster.pool is not None and gpus:
            lock_holders(owner, "")
            refusal = quota_refusal(owner, "", cluster.pool, gpus)
            if refusal is not None:
                raise RayJobRefused("gpus", refusal)
        job = RayJob.objects.create(
            owner=owner,
            cluster=cluster,
            entrypoint=entrypoint,
            runtime_env=runtime_env or {},
            gpus=gpus,
            cpus=cpus,
            submission_id=f"gpuadmin-{uuid.uuid4().hex}",
        )
        record(
            "ray_job.submitted",
            actor=owner,
            target=job,
            after={
                "cluster": cluster.name,
                "entrypoint": entrypoint,
                "gpus": gpus,
                "cpus": cpus,
                "submission_id": job.submission_id,
            },
        )
        # Ray hears of the job only once its row is committed, whatever the caller's
        # transaction: a job Ray runs is always one gpuadmin knows.
        transaction.on_commit(lambda: send(job))
    return job


def send(job: RayJob) -> RayJob:
    """Ask Ray to run a ``pending`` job under its submission id. Ray refuses an id it already
    has; a refusal is therefore checked against Ray's own list before it fails the job."""
    client = client_for(job.cluster)
    try:
        client.submit(
            job.submission_id,
            job.entrypoint,
            runtime_env=job.runtime_env,
            num_gpus=job.gpus,
            num_cpus=job.cpus,
            metadata={"gpuadmin_job": str(job.pk), "gpuadmin_user": job.owner.get_username()},
        )
    except RayUnreachable as exc:
        return _note(job, f"Not sent yet: {exc}. gpuadmin sends it again with the same id.")
    except RayRefused as exc:
        try:
            known = client.job(job.submission_id)
        except RayError:
            return _note(job, f"Not sent yet: {exc}. gpuadmin sends it again with the same id.")
        if known is None:
            return _change(job, RayJobState.FAILED, f"Ray refused it: {exc}", actor_name="ray")
        return _apply(job, known)
    return _read(job)


def follow(job: RayJob) -> RayJob:
    """Bring the job up to date with Ray: a pending one is sent, any other one read."""
    return send(job) if job.state == RayJobState.PENDING else _read(job)


def _read(job: RayJob) -> RayJob:
    """Read the job's state from Ray and store it (an audit row when it changed); a cluster
    that does not answer leaves the job as it was (a pending job stays pending: the next send
    finds it in Ray)."""
    try:
        info = client_for(job.cluster).job(job.submission_id)
    except RayError as exc:
        logger.info("Ray job %s not followed: %s", job.submission_id, exc)
        return job
    return _found(job, info)


def _found(job: RayJob, info: JobInfo | None) -> RayJob:
    """Store what Ray said of the job (None: it has no job of that id)."""
    if info is None:
        return _change(
            job,
            RayJobState.FAILED,
            "The cluster no longer knows this job (was it restarted?).",
            actor_name=POLL_ACTOR,
        )
    return _apply(job, info)


def _from_ms(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, tz=UTC)


def _apply(job: RayJob, info: JobInfo) -> RayJob:
    job.started_at = _from_ms(info.start_time_ms) or job.started_at
    job.ended_at = _from_ms(info.end_time_ms) or job.ended_at
    return _change(job, RAY_STATES[info.status], info.message, actor_name=POLL_ACTOR)


def _note(job: RayJob, message: str) -> RayJob:
    job.message = message
    job.save(update_fields=["message"])
    return job


def _change(
    job: RayJob, state: str, message: str, *, actor_name: str = "", actor: User | None = None
) -> RayJob:
    """Store the job's new state and message; a change of state writes its audit row."""
    with transaction.atomic():
        before = RayJob.objects.select_for_update().get(pk=job.pk).state
        job.state, job.message = state, message
        if state not in ACTIVE_STATES and job.ended_at is None:
            job.ended_at = timezone.now()  # Ray gave no end (it forgot the job, or never had it)
        job.save(update_fields=["state", "message", "started_at", "ended_at"])
        if before != state:
            record(
                f"ray_job.{state}",
                actor=actor,
                actor_name=actor_name,
                target=job,
                before={"state": before},
                after={"state": state, "message": message},
            )
    return job


def visible_jobs(user: User) -> QuerySet[RayJob]:
    """The Ray jobs ``user`` sees, by the rule of gpuadmin's jobs (``visible_to``: users their
    own, viewers, operators and admins everyone's), with their cluster and owner, which the
    API and the pages show. Their entrypoint, environment and log: ``can_read_private``."""
    return visible_to(user, RayJob.objects.select_related("cluster", "owner"))


def cancel(*, actor: User, job: RayJob) -> RayJob:
    """Ask Ray to stop the job (audited ``ray_job.cancel_requested``); the poll reads the state
    it ends in. A job Ray does not have is canceled at once, and will not be sent."""
    if not can_act_on(actor, job):
        raise PermissionDenied("Only its owner, operators and admins cancel a Ray job.")
    if not job.active:
        raise RayJobConflict(f"Ray job {job.pk} has ended ({job.state}).")
    with transaction.atomic():
        record("ray_job.cancel_requested", actor=actor, target=job, before={"state": job.state})
    try:
        client_for(job.cluster).stop(job.submission_id)
    except RayRefused as exc:
        if exc.status != 404:
            raise
        return _change(job, RayJobState.CANCELED, "Canceled before Ray received it.", actor=actor)
    return job


def logs(job: RayJob) -> str:
    """The job's output as Ray keeps it (``RayError`` when the cluster does not give it)."""
    if job.state == RayJobState.PENDING:
        return ""
    return client_for(job.cluster).logs(job.submission_id)


def poll() -> dict[str, int]:
    """Beat's tick: read every cluster and the state of its active jobs, then store what each
    answered and send its pending jobs again. The clusters are asked at once (``ask_all``: a
    few threads, nothing waited for past ``GPUADMIN_RAY_TIMEOUT_S``) and each answer is stored
    as it comes, here, in this thread and its database connection: a cluster that does not
    answer delays neither the others nor the next tick."""
    clusters = {cluster.pk: cluster for cluster in RayCluster.objects.all()}
    active: dict[int, list[RayJob]] = defaultdict(list)
    for job in RayJob.objects.filter(state__in=ACTIVE_STATES).select_related("cluster", "owner"):
        active[job.cluster_id].append(job)
    questions = {
        pk: partial(
            client_for(cluster).poll,
            {job.pk: job.submission_id for job in active[pk] if job.state != RayJobState.PENDING},
        )
        for pk, cluster in clusters.items()
    }
    reachable, followed, unsent = 0, 0, []
    for pk, answer in ask_all(questions, deadline_s=settings.GPUADMIN_RAY_TIMEOUT_S):
        view, infos = (answer.view, answer.jobs) if isinstance(answer, PollAnswer) else (answer, {})
        if store_read(clusters[pk], view).state != ClusterState.OK:
            continue
        reachable, followed = reachable + 1, followed + len(active[pk])
        for job in active[pk]:
            info = infos.get(job.pk)
            if job.state == RayJobState.PENDING:
                unsent.append(job)
            elif isinstance(info, RayError):
                logger.info("Ray job %s not followed: %s", job.submission_id, info)
            else:
                _found(job, info)
    # Rare (a job whose first send found its cluster silent), and after every answer is stored.
    for job in unsent:
        send(job)
    return {"clusters": reachable, "jobs": followed}

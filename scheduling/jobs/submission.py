"""Job submission: a request checked against the limits and the fleet's shape, then stored as
one job or an array of tasks with their dependencies.
"""

from __future__ import annotations

import importlib.util
import posixpath
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuadmin.audit.services import (
    create_recorded,
)
from inventory.models import Pool
from inventory.services import resolve_gpu_model
from scheduling import placement
from scheduling.allocations.services import JobBooker
from scheduling.jobs import dependencies
from scheduling.jobs.limits import (
    MAX_ARGV,
    MAX_COMMAND_CHARS,
    SUBMISSION_LIMITS,
    JobRejected,
    check_env,
    check_image,
    check_limits,
    check_text,
    parse_array,
    split_command,
)
from scheduling.jobs.shape import FleetShape
from scheduling.loop import dispatch
from scheduling.models import (
    Job,
    JobArray,
    JobState,
    Reservation,
    ReservationState,
    Topology,
)
from scheduling.placement.reservations import ReservationBook
from scheduling.placement.text import plural

SHARES_ONE_GPU = "a MIG device or an MPS share is one GPU of one node"
# Topology.values builds its list anew on every use (about 1 % of a submission's CPU).
TOPOLOGIES = tuple(Topology.values)


@dataclass(frozen=True)
class Submission:
    """A checked request: what ``Job`` rows of it hold, and what they depend on."""

    fields: dict[str, Any]  # Job fields, pool and reservation as rows
    needs: list[tuple[str, Job]]  # (DependencyKind, job it depends on)

    @property
    def dependency_text(self) -> str:
        """``afterok:12:13,afterany:14``, as Slurm writes it."""
        return dependencies.text((kind, job.pk) for kind, job in self.needs)


def check_submission(
    owner: User,
    *,
    command: str | list[str],
    use_shell: bool = False,
    pool: str | None = None,
    reservation: int | None = None,
    dependency: str | Sequence[tuple[str, int]] | None = None,
    **fields: Any,
) -> Submission:
    """Everything a submission must satisfy before anything is written: ``JobRejected``
    naming the field for a request that could never run. ``pool`` is a pool's name,
    ``reservation`` the id of a requested or approved reservation of ``owner``'s, and
    ``dependency`` Slurm's ``afterok:12:13,afterany:14`` or (kind, job id) pairs."""
    for arg in [command] if isinstance(command, str) else command:
        check_text("command", arg)
    argv = split_command(command, use_shell)
    if not argv or not argv[0].strip():
        raise JobRejected("command", "empty command")
    if len(argv) > MAX_ARGV:
        raise JobRejected("command", f"at most {MAX_ARGV} arguments")
    if sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise JobRejected("command", f"at most {MAX_COMMAND_CHARS} characters")
    for name, value in {**fields, "pool": pool}.items():
        if isinstance(value, str):
            check_text(name, value)
    check_limits(fields)
    check_env(fields.get("env") or {})
    if fields.get("container_image"):
        check_image(fields["container_image"])
    working_dir = fields.get("working_dir") or ""
    if working_dir and not posixpath.isabs(working_dir):
        raise JobRejected("working_dir", f"{working_dir!r} is not an absolute path")
    topology = fields.get("topology", Topology.ANY)
    if topology not in TOPOLOGIES:
        raise JobRejected("topology", f"must be one of {', '.join(TOPOLOGIES)}")
    _check_sharing(fields)
    _check_ray(fields)
    shape = FleetShape.cached()
    if fields.get("gpu_model"):
        fields["gpu_model"] = resolve_gpu_model(
            fields["gpu_model"], shape.model_names, refusal=JobRejected
        )
    if reservation is not None:
        fields["reservation"], pool = _reservation(owner, reservation, pool, fields)
    shape.check(
        pool=pool,
        gpu_count=fields.get("gpu_count", 1),
        node_count=fields.get("node_count", 1),
        gpu_model=fields.get("gpu_model", ""),
        min_mib=fields.get("min_gpu_memory_mib", 0),
        topology=topology,
        mig_profile=fields.get("mig_profile", ""),
        mps=fields.get("mps_percent") is not None,
        mps_memory_mib=fields.get("mps_memory_mib"),
        cpus=fields.get("cpus", 0),
        host_memory_mib=fields.get("host_memory_mib", 0),
    )
    if pool is not None:
        fields["pool"] = Pool.objects.filter(name=pool).first()
        if fields["pool"] is None:  # deleted since the shape was read
            raise JobRejected("pool", f"no pool {pool!r}")
    needs = dependencies.check(owner, dependency) if dependency else []
    return Submission({"command": argv, "use_shell": use_shell, **fields}, needs)


def _check_sharing(fields: Mapping[str, Any]) -> None:
    """A MIG device or an MPS share: one GPU of one node, and not both."""
    mig, mps = fields.get("mig_profile"), fields.get("mps_percent") is not None
    if mig and mps:
        raise JobRejected("mps_percent", "a job gets a MIG device or an MPS share, not both")
    if fields.get("mps_memory_mib") is not None and not mps:
        raise JobRejected("mps_memory_mib", "a memory limit of an MPS share: give mps_percent")
    if (mig or mps) and fields.get("gpu_count", 1) != 1:
        raise JobRejected("gpu_count", f"{SHARES_ONE_GPU}: gpu_count must be 1")
    if (mig or mps) and fields.get("node_count", 1) != 1:
        raise JobRejected("node_count", f"{SHARES_ONE_GPU}: node_count must be 1")
    if mig and fields.get("min_gpu_memory_mib"):
        raise JobRejected("min_gpu_memory_mib", "a MIG device has its profile's memory")
    if mps and fields.get("min_gpu_memory_mib"):
        raise JobRejected(
            "min_gpu_memory_mib", "an MPS share's memory is its limit: give mps_memory_mib"
        )


def _check_ray(fields: Mapping[str, Any]) -> None:
    """``JobRejected`` naming ``ray`` for a Ray application that could not run: Ray is not
    installed (an optional extra), or it asks for a container or an MPS share (a Ray cluster
    runs on the host, on whole GPUs or MIG devices)."""
    if not fields.get("ray"):
        return
    if importlib.util.find_spec("ray") is None:
        raise JobRejected(
            "ray", "Ray is not installed: pip install 'gpuadmin[ray]' here and on the nodes"
        )
    if fields.get("container_image"):
        raise JobRejected("ray", "a Ray application runs on the host: give no container_image")
    if fields.get("mps_percent") is not None:
        raise JobRejected("ray", "a Ray application gets whole GPUs or a MIG device, not MPS")


def _reservation(
    owner: User, reservation_id: int, pool: str | None, fields: Mapping[str, Any]
) -> tuple[Reservation, str | None]:
    """The reservation a job runs in (``owner``'s own, requested or approved, not ended) and
    the job's pool: the reservation's when the job names none. A job that could never run in
    it (whole GPUs only; a maximum runtime that ends inside the window) is refused."""
    found = (
        Reservation.objects.select_related("pool").filter(pk=reservation_id, owner=owner).first()
    )
    if found is None:
        raise JobRejected("reservation", f"you have no reservation {reservation_id}")
    if found.state not in (ReservationState.REQUESTED, ReservationState.APPROVED):
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} is {found.get_state_display().lower()}: jobs run only in "
            "a requested or approved one",
        )
    if found.end <= timezone.now():
        raise JobRejected(
            "reservation", f"reservation {found.pk} ended at {found.end:%Y-%m-%d %H:%M}"
        )
    held = found.pool.name if found.pool else None
    if pool is not None and pool != held:
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} is in {held and f'pool {held}' or 'no pool'}, "
            f"not in pool {pool}",
        )
    needed = fields.get("gpu_count", 1) * fields.get("node_count", 1)
    if needed > found.gpu_count:
        raise JobRejected(
            "reservation",
            f"the job needs {plural(needed, 'GPU')}; reservation {found.pk} holds "
            f"{found.gpu_count}",
        )
    model = fields.get("gpu_model", "")
    if model and found.gpu_model and model != found.gpu_model:
        raise JobRejected(
            "reservation", f"reservation {found.pk} holds {found.gpu_model} GPUs, not {model}"
        )
    if fields.get("mig_profile") or fields.get("mps_percent") is not None:
        raise JobRejected(
            "reservation",
            f"reservation {found.pk} holds whole GPUs: a MIG device or an MPS share runs outside",
        )
    # The engine's rule for a job in a window, as it will place it: from the window's start on.
    window = placement.ReservationWindow(
        found.pk, str(owner.pk), (), found.start.timestamp(), found.end.timestamp()
    )
    book = ReservationBook([window], max(found.start, timezone.now()).timestamp())
    never = book.refusal(JobBooker(str(owner.pk), fields.get("max_runtime_s"), found.pk))
    if never is not None:
        raise JobRejected("max_runtime_s", never[0])
    return found, held


def submitted_after(job: Job, dependency: str) -> dict[str, Any]:
    """What ``job.submitted`` records of a job (of an array's task too): its request's
    state, size and priority, and what else it asked for (``dependency`` as Slurm writes it)."""
    after = {
        "state": job.state,
        "gpu_count": job.gpu_count,
        "node_count": job.node_count,
        "priority": job.priority,
    }
    optional = {
        "pool": job.pool.name if job.pool else None,
        "mig_profile": job.mig_profile,
        "mps_percent": job.mps_percent,
        "mps_memory_mib": job.mps_memory_mib,
        "cpus": job.cpus or None,  # 0: none asked
        "host_memory_mib": job.host_memory_mib or None,
        "reservation": job.reservation_id,
        "array": job.array_id,
        "array_index": job.array_index,
        "dependency": dependency,
        "ray": job.ray or None,
    }
    return {**after, **{name: value for name, value in optional.items() if value not in (None, "")}}


def submit_job(
    owner: User, *, hold: bool = False, idempotency_key: str = "", **request: Any
) -> Job:
    """Validate a request (``check_submission``), store it QUEUED (PENDING when held) with
    its dependencies and audit ``job.submitted``; the placement loop is woken when the
    transaction commits. Raises ``JobRejected`` for requests that could never run.
    ``idempotency_key`` is stored with the job (``submit_once`` reads it)."""
    submission = check_submission(owner, **request)
    job = Job(
        owner=owner,
        state=JobState.PENDING if hold else JobState.QUEUED,
        idempotency_key=idempotency_key,
        **submission.fields,
    )
    # The job and its audit row in one statement, atomic by itself (no BEGIN/COMMIT round
    # trips); a transaction only when its dependencies are rows of their own.
    with transaction.atomic() if submission.needs else nullcontext():
        create_recorded(
            job,
            "job.submitted",
            actor=owner,
            after=submitted_after(job, submission.dependency_text),
        )
        dependencies.store([job.pk], submission.needs)
        if not hold:
            transaction.on_commit(dispatch.wake)
    return job


IDEMPOTENCY_KEY_CHARS = Job._meta.get_field("idempotency_key").max_length or 100


def submit_once(
    owner: User, idempotency_key: str, *, array: str = "", **request: Any
) -> tuple[Job, bool]:
    """``submit_job`` under the client's ``idempotency_key``: the first call with a key
    stores the job, and a resend with the same key by the same owner (after a lost answer, a
    timeout) returns that job, whatever it asks, and stores nothing. The job and whether this
    call stored it. The key is unique per owner in the database
    (``job_owner_idempotency_key_unique``), so two resends racing store one job. A job
    ``array`` takes no key (its tasks are jobs of their own, and a key names one job)."""
    if array:
        raise JobRejected("idempotency_key", "not with an array: a key names one job")
    if not idempotency_key:
        return submit_job(owner, **request), True
    check_text("idempotency_key", idempotency_key)
    if len(idempotency_key) > IDEMPOTENCY_KEY_CHARS:
        raise JobRejected("idempotency_key", f"at most {IDEMPOTENCY_KEY_CHARS} characters")
    earlier = Job.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
    if earlier is not None:
        return earlier, False
    try:
        with transaction.atomic():  # a savepoint inside the caller's transaction
            return submit_job(owner, idempotency_key=idempotency_key, **request), True
    except IntegrityError:
        earlier = Job.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if earlier is None:
            raise
        return earlier, False


@dataclass(frozen=True)
class SubmittedArray:
    array: JobArray


def submit_array(owner: User, spec: str, *, hold: bool = False, **request: Any) -> SubmittedArray:
    """One ``--array`` submission (``spec`` as in ``slurm.parse_array``), checked as a job
    is (``check_submission``, once for all its tasks) and stored as Slurm stores a pending
    array: one ``JobArray`` row with what each task is made with (``template``,
    ``dependency``, ``held``) and its ``array.submitted`` audit row, in one statement; the
    placement loop is woken. Its tasks become jobs (``job.submitted`` each) only when the
    loop reaches them (``arrays.split_due``)."""
    parsed = parse_array(spec)
    submission = check_submission(owner, **request)
    most = SUBMISSION_LIMITS["array_dependencies"][1]
    if len(parsed.indexes) * len(submission.needs) > most:
        raise JobRejected(
            "dependency",
            f"{len(parsed.indexes)} tasks each depending on "
            f"{plural(len(submission.needs), 'job')}: at most {most} dependencies in one array",
        )
    template = dict(submission.fields)  # its tasks' fields, the rows as the array's own keys
    array = JobArray(
        owner=owner,
        spec=spec.strip(),
        size=len(parsed.indexes),
        max_running=parsed.max_running,
        held=hold,
        pool=template.pop("pool", None),
        reservation=template.pop("reservation", None),
        template=template,
        dependency=submission.dependency_text,
    )
    after = {"size": array.size, "max_running": array.max_running, "state": array.unsplit_state}
    # The array and its audit row in one statement, atomic by itself (``submit_job``'s way).
    create_recorded(array, "array.submitted", actor=owner, after=after)
    transaction.on_commit(dispatch.wake)  # held or not: the loop makes its tasks jobs
    return SubmittedArray(array)


def submit(owner: User, *, array: str = "", **request: Any) -> Job | SubmittedArray:
    """``submit_array`` with an ``array`` spec, else ``submit_job``: what the API, the form
    and the CLI call."""
    if array:
        return submit_array(owner, array, **request)
    return submit_job(owner, **request)

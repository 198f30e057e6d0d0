"""Scheduling API serializers: input shapes validate types and ranges (a 400 naming the field),
the job services (``scheduling.jobs``) decide the rest; output shapes are the one definition of each
body."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpuadmin import api
from gpuadmin.access.models import ApiToken
from gpuadmin.access.services import can_read_private
from scheduling.jobs import dependencies, limits, queries, ray, slurm, submission
from scheduling.models import (
    Allocation,
    DependencyKind,
    Job,
    JobArray,
    JobDependency,
    Priority,
    Topology,
)
from scheduling.policies.quotas import NO_POOL

HIDDEN = "(hidden)"


@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "string",
                "description": "split like a POSIX shell (kept whole with use_shell)",
            },
            {"type": "array", "items": {"type": "string"}, "description": "argv"},
        ]
    }
)
class CommandField(serializers.Field):
    """A command line as one string, or as argv (a list of strings)."""

    default_error_messages = {"invalid": "Expected a string or a list of strings."}

    def to_internal_value(self, data: Any) -> str | list[str]:
        if isinstance(data, str):
            return data
        if not isinstance(data, list) or not all(isinstance(arg, str) for arg in data):
            self.fail("invalid")
        return data

    def to_representation(self, value: list[str]) -> list[str]:
        return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "description": "Slurm's syntax: afterok:12:13,afterany:14"},
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"type": "string", "enum": list(DependencyKind.values)},
                        "job": {"type": "integer"},
                    },
                    "required": ["kind", "job"],
                },
            },
        ]
    }
)
class DependencyField(serializers.Field):
    """What a job waits for: Slurm's ``afterok:12:13,afterany:14``, or a list of ``{"kind":
    "afterok", "job": 12}``; the job service checks the kinds and the jobs."""

    default_error_messages = {
        # DRF formats the message: {{ is a brace.
        "invalid": 'Expected a string such as "afterok:12" or a list of {{"kind", "job"}} objects.'
    }

    def to_internal_value(self, data: Any) -> str | list[tuple[str, int]]:
        if isinstance(data, str):
            return data.strip()  # as text fields (and the form) read it: a blank one is none
        if not isinstance(data, list):
            self.fail("invalid")
        pairs = []
        for item in data:
            if not isinstance(item, dict) or set(item) != {"kind", "job"}:
                self.fail("invalid")
            kind, job = item["kind"], item["job"]
            if not isinstance(kind, str) or type(job) is not int or not 0 < job < 2**63:
                self.fail("invalid")
            pairs.append((kind, job))
        return pairs


class PoolNameField(serializers.SlugRelatedField):
    """A pool by name; ``~`` (or null) names the GPUs in no pool, as in the URLs
    (``scheduling.policies.quotas.NO_POOL``)."""

    def to_internal_value(self, data: Any) -> Any:
        return None if data == NO_POOL else super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string, and only a string (``CharField`` turns numbers into strings)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class JobSubmitSerializer(api.SharedFieldsSerializer):
    """What ``POST /queue/submit`` and ``POST /api/v1/jobs/`` take; answered with the job."""

    command = CommandField()
    use_shell = serializers.BooleanField(default=False)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    project = serializers.CharField(max_length=100, required=False, allow_blank=True)
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, max_length=32768, trim_whitespace=False),
        required=False,
    )
    working_dir = serializers.CharField(max_length=1024, required=False, allow_blank=True)
    container_image = serializers.CharField(
        max_length=500,
        required=False,
        allow_blank=True,
        help_text="An OCI image reference: [registry[:port]/]name[:tag][@digest].",
    )
    # Bounds from the service's SUBMISSION_LIMITS, as the submit form's.
    gpu_count = serializers.IntegerField(
        default=1, help_text="GPUs per node.", **limits.limit_bounds("gpu_count")
    )
    node_count = serializers.IntegerField(default=1, **limits.limit_bounds("node_count"))
    min_gpu_memory_mib = serializers.IntegerField(
        default=0, **limits.limit_bounds("min_gpu_memory_mib")
    )
    gpu_model = serializers.CharField(
        max_length=100,
        required=False,
        allow_blank=True,
        help_text="GPU product name, or an unambiguous part of it (H100).",
    )
    topology = serializers.ChoiceField(choices=Topology.choices, default=Topology.ANY)
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    preemptible = serializers.BooleanField(default=False)
    estimated_duration_s = serializers.IntegerField(
        required=False, allow_null=True, **limits.limit_bounds("estimated_duration_s")
    )
    max_runtime_s = serializers.IntegerField(
        required=False, allow_null=True, **limits.limit_bounds("max_runtime_s")
    )
    max_retries = serializers.IntegerField(default=0, **limits.limit_bounds("max_retries"))
    hold = serializers.BooleanField(
        default=False, help_text="Store it PENDING (held) instead of queuing it."
    )
    pool = serializers.CharField(
        max_length=64,
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Name of the pool whose GPUs it runs on; none (or ~): the GPUs in no pool.",
    )
    mig_profile = serializers.CharField(
        max_length=32,
        required=False,
        allow_blank=True,
        help_text="One MIG device of this profile, e.g. 1g.10gb (gpu_count 1).",
    )
    mps_percent = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="An MPS share of one GPU: this % of its SMs (gpu_count 1).",
        **limits.limit_bounds("mps_percent"),
    )
    mps_memory_mib = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The MPS share's device memory limit.",
        **limits.limit_bounds("mps_memory_mib"),
    )
    ray = serializers.BooleanField(
        default=False,
        help_text="Run the command as a Ray application: the job's nodes run a Ray cluster of "
        "its own (the head on the first) and the command, the entrypoint, runs on the head.",
    )
    cpus = serializers.IntegerField(
        default=0,
        help_text="Logical CPUs on each of its nodes (Slurm's --cpus-per-task; 0: none asked). "
        "A request the scheduler counts, not a limit the node enforces.",
        **limits.limit_bounds("cpus"),
    )
    host_memory_mib = serializers.IntegerField(
        default=0,
        help_text="Host RAM in MiB on each of its nodes (Slurm's --mem; 0: none asked). A "
        "request the scheduler counts, not a limit the node enforces.",
        **limits.limit_bounds("host_memory_mib"),
    )
    reservation = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**63 - 1,
        help_text="Id of your requested or approved reservation: it runs on its GPUs, in its "
        "window (and in its pool).",
    )
    dependency = DependencyField(required=False, allow_null=True)
    array = StrictCharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="A job array, as Slurm's --array: 0-999%50, 1,3,5-9 or 0-15:4 (%N: at most N "
        "tasks at once). Answered with the array, not a job.",
    )

    def validate_pool(self, value: str | None) -> str | None:
        return None if value in ("", NO_POOL) else value

    # Whether save() stored what it answers with: False for a resend under an
    # ``idempotency_key`` (context) that answers with the job the first one stored.
    created = True

    def create(self, validated_data: dict[str, Any]) -> Job | submission.SubmittedArray:
        # A JobRejected is the API's 400 naming its field (gpuadmin.api.exception_handler).
        owner = self.context["request"].user
        key = self.context.get("idempotency_key", "")
        if not key:
            return submission.submit(owner, **validated_data)
        job, self.created = submission.submit_once(owner, key, **validated_data)
        return job

    def to_representation(self, instance: Job | submission.SubmittedArray) -> dict[str, Any]:
        if isinstance(instance, submission.SubmittedArray):
            return SubmittedArraySerializer(instance, context=self.context).data
        if self.context.get("minimal"):
            return SubmittedJobSerializer(instance).data
        if self.created:
            with_new_job_details(instance, dependencies=bool(self.validated_data.get("dependency")))
        else:  # the earlier job, as it is now
            instance = queries.with_details(Job.objects.filter(pk=instance.pk)).get()
        return JobSerializer(instance, context=self.context).data


def with_new_job_details(job: Job, *, dependencies: bool) -> Job:
    """``job``, just submitted, with what ``queries.with_details`` would load for it: a new job
    holds no GPUs (and depends on nothing unless it said so). Said the way prefetch_related()
    would, already evaluated, so that its body compiles no query (prefetch_related_objects()
    is a measurable share of a submission's CPU)."""
    cache: dict[str, QuerySet[Any]] = {"allocations": Allocation.objects.none()}
    if not dependencies:
        cache["dependencies"] = JobDependency.objects.none()
    for queryset in cache.values():
        queryset._result_cache = []
    # Django's private prefetch cache: set at runtime, absent from django-stubs' Model.
    job._prefetched_objects_cache = cache  # type: ignore[attr-defined]
    return job


class AllocationSerializer(api.ModelSerializer):
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    node = serializers.CharField(source="node.hostname", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = Allocation
        fields = [
            "id",
            "job",
            "gpu_uuid",
            "gpu_index",
            "node",
            "attempt",
            "manual",
            "active",
            "allocated_at",
            "released_at",
        ]
        read_only_fields = fields


class PlacementSerializer(api.Serializer):
    """Why the GPUs were chosen (``manual`` for ``/cluster/gpu-allocate``)."""

    topology_class = serializers.CharField()
    numa_nodes = serializers.ListField(child=serializers.IntegerField())
    score = serializers.ListField(child=serializers.FloatField())
    explanation = serializers.CharField()
    nodes = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text="Node hostname -> GPU indexes.",
    )


class DependencySerializer(api.ModelSerializer):
    """One thing a job waits for, and where it stands."""

    job = serializers.IntegerField(source="on_id", read_only=True)
    state = serializers.CharField(source="on.state", read_only=True, help_text="The job's.")
    satisfied = serializers.SerializerMethodField(
        help_text="True: it holds; false: it never will (the job is canceled); null: not yet."
    )

    class Meta:
        model = JobDependency
        fields = ["kind", "job", "state", "satisfied"]
        read_only_fields = fields

    def get_satisfied(self, dependency: JobDependency) -> bool | None:
        return dependencies.outcome(dependency.kind, dependency.on.state)


class ArrayTasksSerializer(api.Serializer):
    """A ``queries.ArrayTasks``: the tasks of an array that one row of a collapsed list
    stands for."""

    # A declared field, though Field has a ``label`` attribute (the metaclass takes it out).
    label = serializers.CharField(help_text="As squeue: 12_[3-999%50].")  # type: ignore[assignment]
    indexes = serializers.CharField(help_text="Their indexes, compacted: 3-999.")
    count = serializers.IntegerField()


class JobSerializer(api.ModelSerializer):
    """A job with where it stands: for a waiting job why (``pending_code``/``pending_reason``),
    its queue position, estimated start and what-if; for a placed one, ``placement`` and its
    GPUs (``allocations``, every attempt). What the job keeps private (``command``, ``env``
    values) is shown to those ``can_read_private`` lets read it: to others ``command`` is null
    and each ``env`` value ``(hidden)``. ``array`` and ``array_index``: the job array it is a
    task of; ``dependencies``: the jobs it waits for (Slurm's ``--dependency``)."""

    owner = serializers.CharField(source="owner.get_username", read_only=True)
    command = serializers.SerializerMethodField()
    env = serializers.SerializerMethodField()
    ray_dashboard = serializers.SerializerMethodField(
        help_text="A running Ray application's Ray dashboard; else null."
    )
    ray_token = serializers.SerializerMethodField(
        help_text="The token of a Ray application's cluster while it holds GPUs (its "
        "dashboard asks for it; RAY_AUTH_TOKEN); null for others and when private."
    )
    placement = PlacementSerializer(read_only=True, allow_null=True)
    allocations = AllocationSerializer(many=True, read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True, default=None)
    dependencies = DependencySerializer(many=True, read_only=True)
    array_tasks = serializers.SerializerMethodField(
        help_text="In a list with collapse_arrays: the tasks of its array in its state that "
        "this row stands for (itself the first); else null."
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "project",
            "state",
            "priority",
            "command",
            "use_shell",
            "env",
            "working_dir",
            "container_image",
            "gpu_count",
            "node_count",
            "min_gpu_memory_mib",
            "gpu_model",
            "topology",
            "preemptible",
            "estimated_duration_s",
            "max_runtime_s",
            "max_retries",
            "attempt",
            "failures",
            "preemptions",
            "submitted_at",
            "scheduled_at",
            "started_at",
            "finished_at",
            "exit_code",
            "message",
            "cpu_seconds",
            "max_memory_bytes",
            "pending_code",
            "pending_reason",
            "queue_position",
            "estimated_start_at",
            "what_if",
            "placement",
            "allocations",
            "pool",
            "mig_profile",
            "mps_percent",
            "mps_memory_mib",
            "cpus",
            "host_memory_mib",
            "ray",
            "ray_dashboard",
            "ray_token",
            "reservation",
            "array",
            "array_index",
            "dependencies",
            "borrowed",
            "preempted_by",
            "preempt_requested_at",
            "array_tasks",
        ]
        read_only_fields = fields

    def _private(self, job: Job) -> bool:
        return not can_read_private(self.context["request"].user, job)

    @extend_schema_field(
        {
            "type": "array",
            "items": {"type": "string"},
            "nullable": True,
            "description": "argv; null when private to the job's owner (GPUADMIN_PRIVATE_DATA)",
        }
    )
    def get_command(self, job: Job) -> list[str] | None:
        return None if self._private(job) else job.command

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
    def get_env(self, job: Job) -> dict[str, str]:
        return dict.fromkeys(job.env, HIDDEN) if self._private(job) else job.env

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_ray_dashboard(self, job: Job) -> str | None:
        return ray.dashboard_url(job, job.allocations.all())  # prefetched: ``with_details``

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_ray_token(self, job: Job) -> str | None:
        return ray.shown_token(job, private=self._private(job))

    @extend_schema_field(ArrayTasksSerializer(allow_null=True))
    def get_array_tasks(self, job: Job) -> dict[str, Any] | None:
        tasks = self.context.get("array_tasks", {}).get(job.pk)
        return None if tasks is None else ArrayTasksSerializer(tasks).data


class AttemptSerializer(api.Serializer):
    """A ``queries.Attempt``: one run of a job."""

    attempt = serializers.IntegerField(source="number")
    current = serializers.BooleanField(
        help_text="The run the job's state is about: it holds GPUs, or its end ended the job."
    )
    nodes = serializers.DictField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text='Its GPUs\' indexes by node: {"dgx-01": [0, 1]}.',
    )
    gpus = serializers.SerializerMethodField(help_text="Its GPUs' (or MIG devices') UUIDs.")
    placed_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    ended = serializers.CharField(
        help_text="The state its end left the job in (queued: requeued, preempted, failed, "
        "completed, canceled); empty while it holds GPUs."
    )
    exit_code = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField(help_text="Why it ended.")
    how_it_ended = serializers.CharField(
        help_text="Both in a sentence: requeued: retry 1/2 after attempt 1 failed: exit code 3."
    )

    def get_gpus(self, attempt: queries.Attempt) -> list[str]:
        return [allocation.device_uuid or allocation.gpu.uuid for allocation in attempt.gpus]


class JobDetailSerializer(JobSerializer):
    """A job with its runs (``attempts``, oldest first: one query more than a listed job)."""

    attempts = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "attempts"]
        read_only_fields = fields

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, job: Job) -> Any:
        attempts = queries.job_attempts(job, job.allocations.all())
        return AttemptSerializer(attempts, many=True).data


class SubmittedJobSerializer(api.SharedFieldsSerializer):
    """A submitted job as ``Prefer: return=minimal`` (RFC 7240) asks for it: what only the
    server knows of it, the rest being the request's (GET /api/v1/jobs/<id>/ has all)."""

    id = serializers.IntegerField()
    state = serializers.CharField(help_text="queued, or pending when held")
    submitted_at = serializers.DateTimeField()


class SubmittedArraySerializer(api.Serializer):
    """A ``submission.SubmittedArray``: the answer to a submission with ``array``. Its tasks
    become jobs when the placement loop reaches them (as Slurm splits a pending array), so
    the answer names where they are listed, not job ids."""

    id = serializers.IntegerField(source="array.pk", help_text="The array's id (not a job's).")
    spec = serializers.CharField(source="array.spec")
    size = serializers.IntegerField(source="array.size", help_text="Its tasks: one job each.")
    max_running = serializers.IntegerField(source="array.max_running", allow_null=True)
    state = serializers.CharField(
        source="array.unsplit_state", help_text="Its tasks': queued, or pending when held."
    )
    submitted_at = serializers.DateTimeField(source="array.submitted_at")
    tasks_url = serializers.SerializerMethodField(
        help_text="Its tasks as jobs, each listed once the placement loop has made it one "
        "(/api/v1/jobs/?array=<id>); /api/v1/arrays/<id>/ counts them all by state."
    )

    def get_tasks_url(self, submitted: submission.SubmittedArray) -> str:
        return f"{reverse('scheduling-api-v1:job-list')}?array={submitted.array.pk}"


class ArraySerializer(api.ModelSerializer):
    """A job array and how many of its tasks are in each state (``queries.task_counts``)."""

    owner = serializers.CharField(source="owner.get_username", read_only=True)
    tasks = serializers.SerializerMethodField(
        help_text="State -> tasks in it (none: absent), those not made jobs yet included "
        "(queued, pending when held, canceled with the array)."
    )

    class Meta:
        model = JobArray
        fields = [
            "id",
            "owner",
            "spec",
            "size",
            "max_running",
            "held",
            "submitted_at",
            "split",
            "unsplit",
            "canceled_at",
            "canceled_tasks",
            "tasks",
        ]
        read_only_fields = fields

    unsplit = serializers.IntegerField(
        read_only=True,
        help_text="Its tasks not made jobs yet (never, once it is canceled), those canceled "
        "one by one left out.",
    )
    canceled_tasks = serializers.SerializerMethodField(
        help_text="The indexes of its tasks canceled before they were made jobs, as Slurm "
        "writes them (3-7,9); never made."
    )

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_tasks(self, array: JobArray) -> dict[str, int]:
        return queries.task_counts(array)

    def get_canceled_tasks(self, array: JobArray) -> str:
        return slurm.compact_indexes(array.canceled_tasks)


class ArrayCancelSerializer(api.Serializer):
    """``POST /api/v1/arrays/<id>/cancel/``: which tasks; none named, the whole array."""

    tasks = serializers.CharField(
        required=False,
        trim_whitespace=False,
        help_text="Indexes of its tasks, as Slurm's scancel 12_[3-7,9] names them: 3-7,9 "
        "(indexes, ranges, steps 0-15:4; no %N cap). Absent: the whole array.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A form's blank field is dropped as absent (DRF): here it would cancel everything.
        if "tasks" not in attrs and "tasks" in self.initial_data:
            raise serializers.ValidationError(
                {"tasks": self.fields["tasks"].error_messages["blank"]}
            )
        return attrs


class ArrayCanceledSerializer(api.Serializer):
    """A ``control.ArrayCanceled``."""

    canceled = serializers.ListField(
        child=serializers.IntegerField(), help_text="Tasks canceled now."
    )
    canceling = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Tasks on GPUs: canceled once their agents report their processes gone.",
    )
    unsplit = serializers.IntegerField(
        help_text="Tasks not made jobs yet (the loop had not reached them): canceled with the "
        "array (or those of them named), never made."
    )


class ArrayHeldSerializer(api.Serializer):
    """A ``control.ArrayHeld``: what holding or releasing an array did."""

    jobs = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Its tasks made jobs that were held (queued -> pending) or released "
        "(pending -> queued).",
    )
    unsplit = serializers.IntegerField(
        help_text="Its tasks not made jobs yet, made held (or queued) from now on."
    )


class QueueSerializer(api.Serializer):
    """``GET /queue``: waiting jobs in queue order, then the jobs holding GPUs."""

    waiting = JobSerializer(many=True)
    waiting_count = serializers.IntegerField()
    running = JobSerializer(many=True)
    running_count = serializers.IntegerField()


class PrioritySerializer(api.Serializer):
    priority = serializers.ChoiceField(choices=Priority.choices)


class CanceledSerializer(api.Serializer):
    """A cancel's outcome: ``canceling`` while the agent stops the job's processes."""

    canceling = serializers.BooleanField()
    job = JobSerializer()


class WaitBucketSerializer(api.Serializer):
    # The metaclass moves declared fields off the class, so "label" does not shadow Field.label.
    label = serializers.CharField()  # type: ignore[assignment]
    count = serializers.IntegerField()


class QueueStatisticsSerializer(api.Serializer):
    total_queued = serializers.IntegerField()
    by_state = serializers.DictField(child=serializers.IntegerField())
    started_last_24h = serializers.IntegerField()
    average_wait_s = serializers.FloatField(
        allow_null=True, help_text="Mean of started_at - submitted_at over the last 24 h."
    )
    wait_distribution = WaitBucketSerializer(many=True)
    throughput_jobs_per_hour = serializers.IntegerField(
        help_text="Jobs completed or failed in the last hour."
    )
    oldest_queued_submitted_at = serializers.DateTimeField(allow_null=True)


class GpuShareSerializer(api.ModelSerializer):
    """One active allocation of a GPU in ``/cluster/gpu-status``: the GPU whole, a MIG device
    (``device_uuid``) or an MPS share of it."""

    job_id = serializers.IntegerField(read_only=True)
    job_owner = serializers.CharField(source="job.owner.get_username", read_only=True)

    class Meta:
        model = Allocation
        fields = [
            "id",
            "job_id",
            "job_owner",
            "kind",
            "device_uuid",
            "mps_percent",
            "mps_memory_mib",
            "allocated_at",
        ]
        read_only_fields = fields


class GpuStatusSerializer(api.Serializer):
    """A ``queries.GpuStatus``."""

    node = serializers.CharField(source="gpu.node.hostname")
    index = serializers.IntegerField(source="gpu.index")
    uuid = serializers.CharField(source="gpu.uuid")
    model = serializers.CharField(source="gpu.name")
    memory_total_mib = serializers.IntegerField(source="gpu.memory_total_mib")
    state = serializers.CharField(source="gpu.state")
    error_message = serializers.CharField(source="gpu.error_message")
    mig_enabled = serializers.BooleanField(source="gpu.mig_enabled")
    schedulable = serializers.BooleanField(
        help_text="The one rule finds no reason to refuse it a whole-GPU job now."
    )
    free = serializers.BooleanField(help_text="Schedulable and held by no job.")
    in_use = serializers.BooleanField(
        help_text="A job holds it, or a part of it (one GPU however many shares)."
    )
    unusable = serializers.CharField(
        source="unusable.code",
        allow_null=True,
        default=None,
        help_text="Why it is not schedulable: offline, unreachable, missing, error, draining, "
        "mig or foreign-process.",
    )
    unusable_reason = serializers.CharField(
        source="unusable.message", allow_null=True, default=None
    )
    job_id = serializers.IntegerField(source="allocation.job_id", allow_null=True, default=None)
    job_owner = serializers.CharField(
        source="allocation.job.owner.get_username", allow_null=True, default=None
    )
    allocated_at = serializers.DateTimeField(
        source="allocation.allocated_at", allow_null=True, default=None
    )
    allocations = GpuShareSerializer(
        many=True,
        help_text="Every active allocation of it, oldest first: one for a whole GPU, one per "
        "MIG device or MPS share given (job_id, job_owner, allocated_at: the first's).",
    )


class GpuStatusListSerializer(api.Serializer):
    gpus = GpuStatusSerializer(many=True)
    count = serializers.IntegerField()
    free = serializers.IntegerField()
    allocated = serializers.IntegerField(help_text="GPUs in use, each once.")


class GpuStatusParamsSerializer(api.Serializer):
    node = serializers.CharField(required=False, help_text="Only this node's GPUs.")


class GpuAllocateSerializer(api.Serializer):
    job_id = serializers.IntegerField(min_value=1)
    gpu_uuids = serializers.ListField(
        child=serializers.CharField(max_length=64), min_length=1, max_length=4096
    )


class GpuReleaseSerializer(api.Serializer):
    job_id = serializers.IntegerField(min_value=1)


class ReleaseSerializer(api.Serializer):
    """A ``manual.Release``."""

    job = JobSerializer()
    released = serializers.ListField(
        child=serializers.CharField(), help_text="GPU UUIDs given back now."
    )
    releasing = serializers.ListField(
        child=serializers.CharField(),
        help_text="GPU UUIDs given back once the agent reports the job's processes gone.",
    )


class OrchestratorStatusSerializer(api.Serializer):
    """A ``queries.OrchestratorStatus``."""

    enabled = serializers.BooleanField(source="config.enabled")
    policy = serializers.CharField(source="default_policy.policy")
    aging_interval_s = serializers.IntegerField(source="default_policy.aging_interval_s")
    updated_at = serializers.DateTimeField(source="config.updated_at")
    jobs = serializers.DictField(child=serializers.IntegerField())
    gpus_present = serializers.IntegerField()
    gpus_allocated = serializers.IntegerField(
        help_text="GPUs in use (held whole or in part), each once."
    )
    gpus_free = serializers.IntegerField(help_text="Schedulable and not allocated.")
    last_scheduled_at = serializers.DateTimeField(allow_null=True)


class JobLogSerializer(api.Serializer):
    """A ``queries.JobLog``."""

    text = serializers.CharField()
    exists = serializers.BooleanField(help_text="False: the agent has no log for it (yet).")
    node = serializers.CharField()
    nodes = serializers.ListField(child=serializers.CharField())
    attempt = serializers.IntegerField()


class TokenSerializer(api.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "key_prefix", "created_at", "last_used_at", "revoked_at"]


class NewTokenSerializer(TokenSerializer):
    """The answer to a token creation: the only time the key is shown."""

    key = serializers.CharField(read_only=True)

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key"]
        read_only_fields = fields


class QueueParamsSerializer(api.Serializer):
    limit = serializers.IntegerField(
        min_value=1, max_value=1000, default=100, help_text="Jobs listed of each kind."
    )


class JobListParamsSerializer(api.Serializer):
    collapse_arrays = serializers.BooleanField(
        default=False,
        help_text="One row per job array and state, as squeue lists an array "
        "(``array_tasks`` says which tasks it stands for); each task holding GPUs still has "
        "its own row.",
    )


class LogParamsSerializer(api.Serializer):
    tail = serializers.IntegerField(
        min_value=1, max_value=10_000, default=100, help_text="Lines from the end of the log."
    )
    node = serializers.CharField(
        required=False, help_text="Node of a multi-node job (default: its first node)."
    )

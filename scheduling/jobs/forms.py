"""The job submission form: what a person types, turned into ``submission.submit``'s
arguments (a job, or a job array). The fleet-dependent checks stay in the service
(``JobRejected``), whose field the form shows the message on."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.utils import timezone

from gpuadmin.filters import SuggestInput
from inventory.models import Gpu, Pool
from inventory.pages.common import short_gpu_name
from inventory.units import MIB_PER_GIB
from scheduling.jobs.limits import (
    ENV_NAME,
    MAX_DEPENDENCY_CHARS,
    SUBMISSION_LIMITS,
    JobRejected,
    limit_bounds,
    split_command,
)
from scheduling.jobs.shape import FleetShape
from scheduling.models import Job, Priority, Reservation, ReservationState, Topology
from scheduling.placement.text import plural

DURATION_HELP = "HH:MM:SS, D HH:MM:SS or seconds; empty for none."


class EnvironmentField(forms.CharField):
    """Environment variables typed as KEY=VALUE lines (blank lines and ``#`` comments skipped),
    cleaned to a dict; an error names the line. The job form's and the Ray job form's."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3}))
        kwargs.setdefault("required", False)
        kwargs.setdefault("strip", False)  # a value keeps its spaces
        kwargs.setdefault("label", "Environment")
        kwargs.setdefault("help_text", "KEY=VALUE, one per line.")
        super().__init__(**kwargs)

    def clean(self, value: Any) -> dict[str, str]:
        text: str = super().clean(value)
        env: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, setting = line.partition("=")
            key = key.strip()
            if not sep or not ENV_NAME.match(key):
                raise forms.ValidationError(f"line {number}: expected KEY=VALUE, got {line!r}")
            if key in env:
                raise forms.ValidationError(f"line {number}: {key} is set twice")
            env[key] = setting
        return env


class SubmitJobForm(forms.Form):
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Split into arguments like a POSIX shell would; no shell runs it unless "
        "the box below is ticked.",
    )
    use_shell = forms.BooleanField(required=False, label="Run in a shell (/bin/sh -c)")
    name = forms.CharField(max_length=200, required=False)
    project = forms.CharField(max_length=100, required=False)
    # Bounds from the service's SUBMISSION_LIMITS, as the API's.
    gpu_count = forms.IntegerField(initial=1, label="GPUs per node", **limit_bounds("gpu_count"))
    node_count = forms.IntegerField(initial=1, label="Nodes", **limit_bounds("node_count"))
    gpu_model = forms.ChoiceField(required=False, label="GPU model")
    min_gpu_memory_gib = forms.DecimalField(
        min_value=0,
        max_value=SUBMISSION_LIMITS["min_gpu_memory_mib"][1] // MIB_PER_GIB,
        max_digits=6,
        decimal_places=1,
        required=False,
        label="Min GPU memory (GiB)",
    )
    cpus = forms.IntegerField(
        required=False,
        label="CPUs per node",
        help_text="Host CPUs on each node (Slurm's --cpus-per-task); empty for none.",
        **limit_bounds("cpus"),
    )
    host_memory_gib = forms.DecimalField(
        min_value=0,
        max_value=SUBMISSION_LIMITS["host_memory_mib"][1] // MIB_PER_GIB,
        max_digits=7,
        decimal_places=1,
        required=False,
        label="Host memory per node (GiB)",
        help_text="Host RAM on each node (Slurm's --mem); empty for none. Its limit on a node "
        "that confines jobs: beyond it the job is stopped.",
    )
    topology = forms.ChoiceField(choices=Topology.choices, initial=Topology.ANY)
    priority = forms.ChoiceField(choices=Priority.choices, initial=Priority.NORMAL)
    preemptible = forms.BooleanField(
        required=False,
        help_text="Higher-priority, under-share or less-served work may stop it: it gets the "
        "pool's signal and grace to checkpoint, then waits again.",
    )
    max_runtime = forms.DurationField(required=False, help_text=DURATION_HELP)
    estimated_duration = forms.DurationField(
        required=False, help_text=DURATION_HELP + " Lets the scheduler estimate start times."
    )
    max_retries = forms.IntegerField(initial=0, **limit_bounds("max_retries"))
    env = EnvironmentField()
    working_dir = forms.CharField(max_length=1024, required=False, label="Working directory")
    container_image = forms.CharField(
        max_length=Job._meta.get_field("container_image").max_length,
        required=False,
        label="Container image",
        help_text="Run in this OCI image ([registry/]name[:tag][@digest]); the working "
        "directory is then a path in the image.",
    )
    pool = forms.ChoiceField(required=False, help_text="It runs only on this pool's GPUs.")
    reservation = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=None,
        help_text="Run on the GPUs of one of your reservations, in its window.",
    )
    mig_profile = forms.CharField(
        max_length=32,
        required=False,
        label="MIG profile",
        help_text="One MIG device of this profile instead of whole GPUs; the list offers "
        "the profiles of the fleet's MIG-capable GPUs, by pool.",
        widget=SuggestInput(lambda: FleetShape.now().mig_profile_offers()),
    )
    mps_percent = forms.IntegerField(
        required=False,
        label="MPS share (% of SMs)",
        help_text="A share of one MPS-shared GPU instead of whole GPUs.",
        **limit_bounds("mps_percent"),
    )
    mps_memory_mib = forms.IntegerField(
        required=False, label="MPS memory limit (MiB)", **limit_bounds("mps_memory_mib")
    )
    ray = forms.BooleanField(
        required=False,
        label="Ray application",
        help_text="Run the command on a Ray cluster of the job's own: a Ray head on its first "
        "node, a worker on each other; the command is the entrypoint (RAY_ADDRESS is set).",
    )
    array = forms.CharField(
        max_length=200,
        required=False,
        label="Job array",
        help_text="As Slurm's --array: 0-999%50 (%50: at most 50 tasks at once), 1,3,5-9 or "
        "0-15:4. Each task gets GPUADMIN_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID).",
    )
    dependency = forms.CharField(
        max_length=MAX_DEPENDENCY_CHARS,
        required=False,
        label="Dependency",
        help_text="As Slurm's --dependency: afterok:12:13,afterany:14 (afternotok too).",
    )
    hold = forms.BooleanField(
        required=False,
        label="Hold",
        help_text="Keep it pending (held) until it is released, as Slurm's --hold.",
    )

    # JobRejected names the job's field; the form's field where a person typed it.
    FIELD_OF_JOB_FIELD = {
        "min_gpu_memory_mib": "min_gpu_memory_gib",
        "host_memory_mib": "host_memory_gib",
        "max_runtime_s": "max_runtime",
        "estimated_duration_s": "estimated_duration",
    }

    def __init__(self, *args: Any, user: User | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        models = Gpu.objects.present().order_by("name").values_list("name", flat=True).distinct()
        self._choices("gpu_model", [("", "any model")], ((m, short_gpu_name(m)) for m in models))
        pools = Pool.objects.values_list("name", flat=True)
        self._choices("pool", [("", "none: the GPUs in no pool")], ((p, p) for p in pools))
        reservations = Reservation.objects.filter(
            owner_id=user.pk if user else None,
            state__in=(ReservationState.REQUESTED, ReservationState.APPROVED),
            end__gt=timezone.now(),
        ).order_by("start")
        self._choices(
            "reservation",
            [("", "none")],
            (
                (
                    r.pk,
                    f"#{r.pk}: {plural(r.gpu_count, 'GPU')}, "
                    f"{r.start:%Y-%m-%d %H:%M} to {r.end:%H:%M}",
                )
                for r in reservations
            ),
        )

    def mig_profiles_by_pool(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """Per choice of the pool field (``""``: the GPUs in no pool), the MIG profiles its
        GPUs have, with their models: the page offers those of the pool chosen."""
        shape = FleetShape.now()
        return [
            (
                pool or "",
                [
                    (profile, ", ".join(short_gpu_name(model) for model in models))
                    for profile, models in pool_shape.mig_profiles().items()
                ],
            )
            for pool, pool_shape in shape.pools.items()
            if pool_shape.mig_models
        ]

    def _choices(self, name: str, first: list[tuple[Any, str]], rest: Any) -> None:
        field = self.fields[name]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [*first, *rest]

    def _seconds(self, name: str) -> int | None:
        """Whole seconds, as the API takes them (a fraction is an error on the field, not cut
        off); the service checks them against its limits."""
        value: timedelta | None = self.cleaned_data.get(name)
        if value is None:
            return None
        if value.microseconds:
            self.add_error(name, "Enter a whole number of seconds.")
            return None
        return int(value.total_seconds())

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "command" in data:
            try:
                data["argv"] = split_command(data["command"], data.get("use_shell", False))
            except JobRejected as exc:  # an unclosed quote or a trailing escape
                self.add_error(exc.field, exc.message)
        data["max_runtime_s"] = self._seconds("max_runtime")
        data["estimated_duration_s"] = self._seconds("estimated_duration")
        return data

    def submission(self) -> dict[str, Any]:
        """``submission.submit``'s keyword arguments (after ``is_valid()``)."""
        data = self.cleaned_data
        memory: Decimal | None = data["min_gpu_memory_gib"]
        host_memory: Decimal | None = data["host_memory_gib"]
        return {
            "command": data["argv"],
            "use_shell": data["use_shell"],
            "name": data["name"],
            "project": data["project"],
            "gpu_count": data["gpu_count"],
            "node_count": data["node_count"],
            "gpu_model": data["gpu_model"],
            "min_gpu_memory_mib": round(memory * MIB_PER_GIB) if memory else 0,
            "cpus": data["cpus"] or 0,
            "host_memory_mib": round(host_memory * MIB_PER_GIB) if host_memory else 0,
            "topology": data["topology"],
            "priority": data["priority"],
            "preemptible": data["preemptible"],
            "max_runtime_s": data["max_runtime_s"],
            "estimated_duration_s": data["estimated_duration_s"],
            "max_retries": data["max_retries"],
            "env": data["env"],
            "working_dir": data["working_dir"],
            "container_image": data["container_image"],
            "pool": data["pool"] or None,
            "reservation": data["reservation"],
            "mig_profile": data["mig_profile"],
            "mps_percent": data["mps_percent"],
            "mps_memory_mib": data["mps_memory_mib"],
            "ray": data["ray"],
            "array": data["array"],
            "dependency": data["dependency"] or None,
            "hold": data["hold"],
        }

    def add_rejection(self, exc: JobRejected) -> None:
        """Show the service's refusal on the field it names (the form's errors otherwise)."""
        field = self.FIELD_OF_JOB_FIELD.get(exc.field, exc.field)
        self.add_error(field if field in self.fields else None, exc.message)

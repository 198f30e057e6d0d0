"""The job submission form: what a person types, turned into ``services.submit_job``'s
arguments. The fleet-dependent checks stay in the service (``JobRejected``), whose field the
form shows the message on."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms

from inventory.models import Gpu
from inventory.pages.common import MIB_PER_GIB, short_gpu_name
from scheduling.models import Priority, Topology
from scheduling.services import (
    ENV_NAME,
    SUBMISSION_LIMITS,
    JobRejected,
    limit_bounds,
    split_command,
)

DURATION_HELP = "HH:MM:SS, D HH:MM:SS or seconds; empty for none."


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
    topology = forms.ChoiceField(choices=Topology.choices, initial=Topology.ANY)
    priority = forms.ChoiceField(choices=Priority.choices, initial=Priority.NORMAL)
    max_runtime = forms.DurationField(required=False, help_text=DURATION_HELP)
    estimated_duration = forms.DurationField(
        required=False, help_text=DURATION_HELP + " Lets the scheduler estimate start times."
    )
    max_retries = forms.IntegerField(initial=0, **limit_bounds("max_retries"))
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        strip=False,  # a value keeps its spaces
        label="Environment",
        help_text="KEY=VALUE, one per line.",
    )
    working_dir = forms.CharField(max_length=1024, required=False, label="Working directory")

    # JobRejected names the job's field; the form's field where a person typed it.
    FIELD_OF_JOB_FIELD = {
        "min_gpu_memory_mib": "min_gpu_memory_gib",
        "max_runtime_s": "max_runtime",
        "estimated_duration_s": "estimated_duration",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        models = Gpu.objects.present().order_by("name").values_list("name", flat=True).distinct()
        field = self.fields["gpu_model"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "any model")] + [(name, short_gpu_name(name)) for name in models]

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, sep, value = line.partition("=")
            key = key.strip()
            if not sep or not ENV_NAME.match(key):
                raise forms.ValidationError(f"line {number}: expected KEY=VALUE, got {line!r}")
            if key in env:
                raise forms.ValidationError(f"line {number}: {key} is set twice")
            env[key] = value
        return env

    def _seconds(self, name: str) -> int | None:
        """Whole seconds; the service checks them against its limits."""
        value: timedelta | None = self.cleaned_data.get(name)
        return None if value is None else int(value.total_seconds())

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
        """``services.submit_job``'s keyword arguments (after ``is_valid()``)."""
        data = self.cleaned_data
        memory: Decimal | None = data["min_gpu_memory_gib"]
        return {
            "command": data["argv"],
            "use_shell": data["use_shell"],
            "name": data["name"],
            "project": data["project"],
            "gpu_count": data["gpu_count"],
            "node_count": data["node_count"],
            "gpu_model": data["gpu_model"],
            "min_gpu_memory_mib": round(memory * MIB_PER_GIB) if memory else 0,
            "topology": data["topology"],
            "priority": data["priority"],
            "max_runtime_s": data["max_runtime_s"],
            "estimated_duration_s": data["estimated_duration_s"],
            "max_retries": data["max_retries"],
            "env": data["env"],
            "working_dir": data["working_dir"],
        }

    def add_rejection(self, exc: JobRejected) -> None:
        """Show the service's refusal on the field it names (the form's errors otherwise)."""
        field = self.FIELD_OF_JOB_FIELD.get(exc.field, exc.field)
        self.add_error(field if field in self.fields else None, exc.message)

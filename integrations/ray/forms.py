"""The Ray job form: what a person types, turned into ``services.submit``'s arguments (as the
API takes them). The service's refusals (quota, entrypoint) show on the field they name."""

from __future__ import annotations

from typing import Any

from django import forms

from gpuadmin.refusals import FieldRefusal
from integrations.ray.models import RayCluster
from scheduling.jobs.forms import EnvironmentField


class RayJobForm(forms.Form):
    cluster = forms.ModelChoiceField(
        queryset=RayCluster.objects.order_by("name"), to_field_name="name", empty_label=None
    )
    entrypoint = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="The shell command Ray runs (python train.py --epochs 3).",
    )
    gpus = forms.FloatField(
        min_value=0, initial=0, label="GPUs", help_text="Ray's entrypoint_num_gpus: 0.5 is half."
    )
    cpus = forms.FloatField(min_value=0, initial=0, label="CPUs")
    env = EnvironmentField(help_text="KEY=VALUE, one per line: runtime_env's env_vars.")
    runtime_env = forms.JSONField(
        required=False,
        label="Runtime environment",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Ray\'s runtime_env as JSON ({"pip": ["torch"], "working_dir": "s3://..."}); '
        "the variables above are added to its env_vars.",
    )

    def clean_runtime_env(self) -> dict[str, Any]:
        value = self.cleaned_data["runtime_env"]
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("a JSON object ({...})")
        return value

    def submission(self) -> dict[str, Any]:
        """``services.submit``'s keyword arguments (after ``is_valid()``)."""
        data = self.cleaned_data
        runtime_env = dict(data["runtime_env"])
        if data["env"]:
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **data["env"]}
        return {
            "cluster": data["cluster"],
            "entrypoint": data["entrypoint"],
            "runtime_env": runtime_env,
            "gpus": data["gpus"],
            "cpus": data["cpus"],
        }

    def add_refusal(self, exc: FieldRefusal) -> None:
        """Show the service's refusal on the field it names (the form's errors otherwise)."""
        self.add_error(exc.field if exc.field in self.fields else None, exc.message)

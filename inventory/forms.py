"""Forms of the inventory pages (the admins' MIG changes)."""

from __future__ import annotations

from typing import Any

from django import forms

from inventory.models import Gpu
from inventory.nvml import mig_catalog


class MigCreateForm(forms.Form):
    """A GPU instance to create: a profile of the GPU's table, optionally at a placement."""

    profile_name = forms.ChoiceField(label="Profile")
    placement_start = forms.IntegerField(
        label="At memory slice", min_value=0, required=False, help_text="Empty: NVML chooses."
    )

    def __init__(self, *args: Any, gpu: Gpu, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        table = mig_catalog.table_for_gpu(gpu.name)
        profiles = table.profiles if table else ()
        field = self.fields["profile_name"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(p.name, p.name) for p in profiles]

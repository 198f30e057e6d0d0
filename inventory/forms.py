"""Forms of the inventory pages (the admins' MIG changes, maintenance)."""

from __future__ import annotations

from typing import Any

from django import forms

from inventory.choices import MAINTENANCE_GPU_STATES, MAINTENANCE_NODE_STATES
from inventory.models import STATE_REASON_CHARS, Gpu, Node
from inventory.nvml import mig_catalog
from inventory.services import GPU_TRANSITIONS


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


class StateChangeForm(forms.Form):
    """A maintenance change of a GPU or node from its page and why. Shown, it offers the
    states the row may go to now (the state machine's table for GPUs); posted, it takes any
    maintenance state, so a change the state machine refuses meanwhile gets its own message."""

    state = forms.ChoiceField(label="Change to")
    reason = forms.CharField(label="Reason", max_length=STATE_REASON_CHARS)

    def __init__(self, *args: Any, row: Gpu | Node, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(row, Gpu):
            verbs, allowed = MAINTENANCE_GPU_STATES, GPU_TRANSITIONS[row.state]
        else:
            verbs, allowed = MAINTENANCE_NODE_STATES, frozenset(MAINTENANCE_NODE_STATES)
        field = self.fields["state"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [
            (state, verb)
            for state, verb in verbs.items()
            if self.is_bound or (state != row.state and state in allowed)
        ]

"""The form of a pool's policy (the policies page and the admin): values checked by the rules
of ``admin_services.check_policy``, each error on its field."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduling import admin_services
from scheduling.models import PoolPolicy


class PolicyForm(forms.ModelForm):
    preempt_signal = forms.ChoiceField(
        choices=[(name, name) for name in admin_services.PREEMPT_SIGNALS],
        help_text="Sent to a preempted job first; SIGKILL follows after the grace.",
    )

    class Meta:
        model = PoolPolicy
        fields = admin_services.POLICY_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in admin_services.POLICY_FIELDS:
            if name in data:
                try:
                    admin_services.check_policy({name: data[name]})
                except admin_services.PolicyInvalid as exc:
                    self.add_error(name, exc.message)
        return data


def policy_values(form: forms.ModelForm) -> dict[str, Any]:
    """A valid policy form's values, as ``admin_services.set_pool_policy`` takes them."""
    return {name: form.cleaned_data[name] for name in admin_services.POLICY_FIELDS}

"""The forms of a pool's policy and of a quota (the policies and quotas pages and the admin):
values checked by the rules of ``policy_services.check_policy`` and ``quotas.check_quota``, each
error on its field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.text import capfirst

from scheduling.models import PoolPolicy, Quota
from scheduling.policies import quotas
from scheduling.policies import services as policy_services


class PolicyForm(forms.ModelForm):
    preempt_signal = forms.ChoiceField(
        label=capfirst(PoolPolicy._meta.get_field("preempt_signal").verbose_name),
        choices=[(name, name) for name in policy_services.PREEMPT_SIGNALS],
        help_text=PoolPolicy._meta.get_field("preempt_signal").help_text,
    )

    class Meta:
        model = PoolPolicy
        fields = policy_services.POLICY_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in policy_services.POLICY_FIELDS:
            if name in data:
                try:
                    policy_services.check_policy({name: data[name]})
                except policy_services.PolicyInvalid as exc:
                    self.add_error(name, exc.message)
        return data


def policy_values(form: forms.ModelForm) -> dict[str, Any]:
    """A valid policy form's values, as ``policy_services.set_pool_policy`` takes them."""
    return {name: form.cleaned_data[name] for name in policy_services.POLICY_FIELDS}


QUOTA_FORM_FIELDS = ("pool", "user", "project", *quotas.QUOTA_FIELDS)


class QuotaForm(forms.ModelForm):
    class Meta:
        model = Quota
        fields = QUOTA_FORM_FIELDS

    def clean(self) -> dict[str, Any]:
        """The service's checks, each on its field (one a field's own check refused already
        stays as it is): a holder named twice is said on its field, not by the table's
        constraint, and only when its pool, user and project are the ones asked for."""
        data = super().clean() or {}
        quota = Quota(pk=self.instance.pk, **data)
        holder_known = not {"pool", "user", "project"} & set(self.errors)
        for field, message in quotas.quota_problems(quota, holder_known=holder_known):
            if field not in self.errors:
                self.add_error(field if field in self.fields else None, message)
        return data

    def validate_unique(self) -> None:
        """``quotas.quota_problems`` checked the holder (one quota per holder and pool) on the
        field it names; the constraints' own messages would repeat it without a field."""


def quota_values(form: forms.ModelForm) -> dict[str, Any]:
    """A valid quota form's values, as the ``quotas`` services take them."""
    return {name: form.cleaned_data[name] for name in QUOTA_FORM_FIELDS}

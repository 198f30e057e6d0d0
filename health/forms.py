"""The alerts pages' forms."""

from __future__ import annotations

from django import forms


class AcknowledgeForm(forms.Form):
    comment = forms.CharField(
        max_length=2000,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "What is being done (optional)"}),
    )

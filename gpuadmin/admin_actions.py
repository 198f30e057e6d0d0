"""Admin actions that ask for a reason first, on an intermediate page (like Django's delete
confirmation): every maintenance change of a GPU or node, a quarantine's release."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.validators import MaxLengthValidator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

# What the action does to each selected row with the reason: a sentence saying it was
# refused, or None when it went through.
Apply = Callable[[Any, str, HttpRequest], str | None]


class ReasonForm(forms.Form):
    reason = forms.CharField(
        widget=forms.TextInput(attrs={"size": 80, "autofocus": True}),
        help_text="Shown with the change and in the audit log.",
    )

    def __init__(self, *args: Any, max_length: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["reason"]
        assert isinstance(field, forms.CharField)
        field.max_length = max_length
        field.validators.append(MaxLengthValidator(max_length))
        field.widget.attrs["maxlength"] = str(max_length)


def reason_action(
    name: str, description: str, apply: Apply, *, max_length: int
) -> Callable[..., Any]:
    """An admin action that asks for a reason (at most ``max_length`` characters), then calls
    ``apply(row, reason, request)`` for each selected row, and says how many went through and
    why the others were refused."""

    def action(
        modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet
    ) -> TemplateResponse | None:
        form = ReasonForm(request.POST if "apply" in request.POST else None, max_length=max_length)
        if form.is_valid():
            refusals = [
                refusal
                for row in queryset
                if (refusal := apply(row, form.cleaned_data["reason"], request)) is not None
            ]
            done = len(queryset) - len(refusals)
            modeladmin.message_user(request, f"{description}: {done} done.", messages.SUCCESS)
            for refusal in refusals:
                modeladmin.message_user(request, refusal, messages.ERROR)
            return None  # back to the list
        context = {
            **modeladmin.admin_site.each_context(request),
            "title": f"{description}: why?",
            "description": description,
            "action_name": name,
            "form": form,
            "queryset": queryset,
            "opts": modeladmin.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/action_reason.html", context)

    action.__name__ = name
    return admin.action(description=description)(action)

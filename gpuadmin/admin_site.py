"""The admin site: Django's, named for gpuadmin, one guard that every model's list shares (the
auth app's included: this is the default site, ``AdminConfig``), and the form of a model that
keeps a secret it must send back (an integration's token)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from gpuadmin.text import unstorable


class CheckedSelection(admin.ModelAdmin):
    """A list action's selected rows are ids of the list's model: a value that is not one (a
    hand-made POST) sends the list back with a message, where Django's filter by it was a
    500. Mixed in before each registered admin (``AdminSite.register``)."""

    def response_action(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        pk = self.model._meta.pk
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                if problem := unstorable(value):  # a text key with a NUL: PostgreSQL refuses it
                    raise ValidationError(problem)
                pk.to_python(value)
            except ValidationError:
                noun = self.model._meta.verbose_name
                message = f"{value[:40]!r} is not the id of a {noun}: nothing was done."
                self.message_user(request, message, messages.ERROR)
                return None  # Django goes back to the list
        return super().response_action(request, queryset)


class AdminSite(admin.AdminSite):
    site_header = "gpuadmin"
    site_title = "gpuadmin"
    index_title = "Fleet catalog"

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        """Register as Django does, each model's admin with ``CheckedSelection`` first."""
        base = admin_class or admin.ModelAdmin
        checked = type(base.__name__, (CheckedSelection, base), {"__module__": base.__module__})
        super().register(model_or_iterable, checked, **options)


class AdminConfig(DjangoAdminConfig):
    default_site = "gpuadmin.admin_site.AdminSite"

    def ready(self) -> None:
        super().ready()
        # The Celery app must be loaded whenever Django is, so @shared_task binds to it; here
        # rather than in the package, which the CLI's API verbs import without Django.
        import gpuadmin.celery  # noqa: F401


class WriteOnlyTokenForm(forms.ModelForm):
    """A model form whose ``token`` is never shown: left empty, the stored one stays.
    ``token_help`` says what the token is."""

    token_help = ""
    token = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False)
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["token"].help_text = self.token_help

    def clean_token(self) -> str:
        given: str = self.cleaned_data["token"]
        return given or (self.instance.token if self.instance.pk else "")

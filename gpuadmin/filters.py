"""What every app's FilterSets share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django import forms
from django.db.models import Model
from django.forms.renderers import BaseRenderer
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

# The choices of a yes/no filter on a page: blank means either (a NullBooleanSelect would
# say "Unknown", which reads as a third state).
ANY_YES_NO = [("", "Any"), ("true", "Yes"), ("false", "No")]


class SuggestInput(forms.TextInput):
    """A text input offering the values it may take as a ``<datalist>``; ``suggestions`` is
    read only when the field is rendered (the page's form), never when the API filters. A
    suggestion is a value, or a (value, label) pair whose label says what it is."""

    def __init__(self, suggestions: Callable[[], Iterable[str | tuple[str, str]]]) -> None:
        super().__init__()
        self.suggestions = suggestions

    def render(
        self,
        name: str,
        value: Any,
        attrs: dict[str, Any] | None = None,
        renderer: BaseRenderer | None = None,
    ) -> SafeString:
        list_id = f"suggest-{name}"
        field = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join(
            "",
            "{}",
            (
                (format_html('<option value="{}" label="{}">', *s),)
                if isinstance(s, tuple)
                else (format_html('<option value="{}">', s),)
                for s in self.suggestions()
            ),
        )
        return format_html('{}<datalist id="{}">{}</datalist>', field, list_id, options)


def distinct_values(model: type[Model], field: str) -> Iterable[str]:
    """The distinct non-empty values of ``field``, in order: a filter's suggestions (read when
    the form is drawn, never by the API or a polled partial)."""
    values = (
        model._default_manager.exclude(**{field: ""}).order_by(field).values_list(field, flat=True)
    )
    return values.distinct()

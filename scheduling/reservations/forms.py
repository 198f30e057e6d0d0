"""The reservation request form of the reservations page; ``scheduling.reservations.services``
decides, and its refusals show on the field they name."""

from __future__ import annotations

from typing import Any

from django import forms

from gpuadmin.filters import SuggestInput, distinct_values
from inventory.models import Gpu, Node, Pool
from scheduling.placement.text import listing
from scheduling.reservations import services as reservations


class DateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"


class ReservationForm(forms.Form):
    gpu_count = forms.IntegerField(
        label="GPUs",
        min_value=1,
        max_value=reservations.MAX_GPUS,
        required=False,
        help_text="Blank: the number of GPUs named below, else 1.",
    )
    start = forms.DateTimeField(widget=DateTimeInput(format="%Y-%m-%dT%H:%M"))
    end = forms.DateTimeField(
        widget=DateTimeInput(format="%Y-%m-%dT%H:%M"), help_text="The GPUs are free again then."
    )
    pool = forms.ModelChoiceField(
        Pool.objects.all(), to_field_name="name", required=False, empty_label="no pool"
    )
    gpu_model = forms.CharField(
        label="GPU model",
        max_length=100,
        required=False,
        widget=SuggestInput(lambda: distinct_values(Gpu, "name")),
    )
    node = forms.ModelChoiceField(
        Node.objects.order_by("hostname"),
        to_field_name="hostname",
        required=False,
        empty_label="any node",
    )
    gpus = forms.CharField(
        label="GPU UUIDs",
        required=False,
        max_length=reservations.MAX_GPUS * 48,  # a UUID and a separator each, with room
        help_text="Exactly these GPUs (separated by spaces or commas).",
    )
    project = forms.CharField(max_length=100, required=False)
    note = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )

    def clean_gpus(self) -> list[Gpu]:
        uuids = list(dict.fromkeys(self.cleaned_data["gpus"].replace(",", " ").split()))
        if len(uuids) > reservations.MAX_GPUS:
            raise forms.ValidationError(f"At most {reservations.MAX_GPUS} GPUs.")
        found = {gpu.uuid: gpu for gpu in Gpu.objects.filter(uuid__in=uuids)}
        unknown = [uuid for uuid in uuids if uuid not in found]
        if unknown:
            raise forms.ValidationError(f"No such GPU: {listing(unknown)}")
        return [found[uuid] for uuid in uuids]

    def request(self) -> dict[str, Any]:
        """The keyword arguments of ``reservations.request`` but the owner."""
        data = self.cleaned_data
        return {
            "gpu_count": data["gpu_count"],
            "start": data["start"],
            "end": data["end"],
            "pool": data["pool"],
            "gpu_model": data["gpu_model"],
            "node": data["node"],
            "gpus": data["gpus"],
            "project": data["project"],
            "note": data["note"],
        }

    def add_refusal(self, exc: reservations.ReservationInvalid) -> None:
        self.add_error(exc.field if exc.field in self.fields else None, exc.message)

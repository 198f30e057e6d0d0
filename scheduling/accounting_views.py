"""The usage page (GPU-hours per user, project or pool over a period, with a daily chart) and
its CSV export. Everyone signed in reads everyone's use, like ``sreport`` (and the queue)."""

from __future__ import annotations

from datetime import date, timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from scheduling import accounting

MAX_PERIOD_DAYS = 366
CHART_HEIGHT = 160  # SVG user units; the chart's width follows the number of days
BAR_WIDTH = 8


class PeriodForm(forms.Form):
    start = forms.DateField(required=False, help_text="First day (default: the 1st of the month).")
    end = forms.DateField(required=False, help_text="Last day (default: today).")
    group = forms.ChoiceField(required=False, choices=[(name, name) for name in accounting.GROUPS])

    def clean(self) -> dict:
        data = with_defaults(super().clean() or {})
        if data["start"] > data["end"]:
            self.add_error("start", "must not be after the end")
        elif (data["end"] - data["start"]).days >= MAX_PERIOD_DAYS:
            self.add_error("start", f"a period of at most {MAX_PERIOD_DAYS} days")
        return data


def with_defaults(data: dict) -> dict:
    """The period asked for, this month so far and per user where it says nothing."""
    end = data.get("end") or timezone.localdate()
    return {
        "end": end,
        "start": data.get("start") or end.replace(day=1),
        "group": data.get("group") or "user",
    }


def _chart(days: list[accounting.DayTotal]) -> dict:
    """Bars per day in SVG units: allocated (full height) with used inside it."""
    peak = max((day.allocated_h for day in days), default=0) or 1
    width = BAR_WIDTH + 2
    return {
        "width": width * len(days),
        "height": CHART_HEIGHT,
        "peak": peak,
        "bar_width": BAR_WIDTH,
        "bars": [
            {
                "x": index * width,
                "allocated": round(day.allocated_h / peak * CHART_HEIGHT, 2),
                "used": round(day.used_h / peak * CHART_HEIGHT, 2),
                "allocated_y": round(CHART_HEIGHT - day.allocated_h / peak * CHART_HEIGHT, 2),
                "used_y": round(CHART_HEIGHT - day.used_h / peak * CHART_HEIGHT, 2),
                "title": f"{day.day}: {day.allocated_h:.1f} GPU-h allocated, {day.used_h:.1f} used",
                "day": day,
            }
            for index, day in enumerate(days)
        ],
    }


@login_required
@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    form = PeriodForm(request.GET)
    form.is_valid()
    period = with_defaults({} if form.errors else form.cleaned_data)
    rows = accounting.usage(period["start"], period["end"], period["group"])
    return render(
        request,
        "scheduling/usage.html",
        {
            "form": form,
            "period": period,
            "rows": rows,
            "total": accounting.totals(rows),
            "chart": _chart(accounting.daily(period["start"], period["end"])),
            "previous_month": (period["start"].replace(day=1) - timedelta(days=1)).replace(day=1),
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponse:
    form = PeriodForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(form.errors.as_text(), content_type="text/plain")
    start: date = form.cleaned_data["start"]
    end: date = form.cleaned_data["end"]
    response = HttpResponse(accounting.csv_text(start, end), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="gpu-usage-{start}-{end}.csv"'
    return response

"""The usage page (GPU-hours per user, project or pool over a period, with a daily chart, and
the GPU-hour budgets of the current periods) and its CSV export. Everyone signed in reads
everyone's use, like ``sreport`` (and the queue); budgets are quotas, read as quotas are."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.http import require_GET

from gpuadmin import dates
from gpuadmin.access.permissions import signed_in
from scheduling.allocations import accounting
from scheduling.policies import quotas

CHART_HEIGHT = 160  # SVG user units; the chart's width follows the number of days
BAR_WIDTH = 8


class PeriodForm(forms.Form):
    start = forms.DateField(
        required=False,
        input_formats=dates.DAY_INPUT_FORMATS,
        help_text="First day (default: the 1st of the month).",
    )
    end = forms.DateField(
        required=False,
        input_formats=dates.DAY_INPUT_FORMATS,
        help_text="Last day (default: today).",
    )
    group = forms.ChoiceField(required=False, choices=[(name, name) for name in accounting.GROUPS])

    def clean(self) -> dict:
        data = super().clean() or {}
        try:
            self.period = accounting.period(data.get("start"), data.get("end"), data.get("group"))
        except accounting.PeriodInvalid as exc:
            self.add_error(exc.field, exc.message)
        return data


def _chart(days: list[accounting.DayTotal]) -> dict:
    """Bars per day in SVG units: allocated (full height) with used inside it; no bars (and
    a peak of 0) when nothing was allocated, so that the page says so instead of drawing an
    empty scale."""
    peak = max((day.allocated_h for day in days), default=0)
    if not peak:
        return {"peak": 0, "bars": []}
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
    period = form.period if form.is_valid() else accounting.period()
    rows = accounting.usage(period.start, period.end, period.group)
    return render(
        request,
        "scheduling/usage.html",
        {
            "form": form,
            "period": period,
            "rows": rows,
            "total": accounting.totals(rows),
            "chart": _chart(accounting.daily(period.start, period.end)),
            "budgets": quotas.budgets(signed_in(request)),
            "previous_month": (period.start.replace(day=1) - timedelta(days=1)).replace(day=1),
        },
        status=400 if form.errors else 200,
    )


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponse:
    form = PeriodForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(form.errors.as_text(), content_type="text/plain")
    start, end = form.period.start, form.period.end
    response = HttpResponse(accounting.csv_text(start, end), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="gpu-usage-{start}-{end}.csv"'
    return response

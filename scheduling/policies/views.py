"""The policies page (each pool's policy; admins edit one through its form), the quotas page
(every quota the viewer may read with its holder's use; admins add, change and remove them),
the fair-share page ("why is my priority what it is": everyone's share, decayed usage and
factor in a pool, and the viewer's explanation), and the viewer's quota use.

Everyone signed in reads these pages, like the usage page (users see their own quotas and
their projects', as in the API); changing a policy or a quota needs the admin role and goes
through ``policy_services.set_pool_policy`` or the ``quotas`` services (audited).
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in
from gpuadmin.access.services import is_admin
from inventory.models import Pool
from inventory.units import duration_text
from scheduling.models import Quota
from scheduling.policies import quotas
from scheduling.policies import services as policy_services
from scheduling.policies.forms import PolicyForm, QuotaForm, policy_values, quota_values

QUOTA_PAGE_ROWS = 100


@login_required
@require_GET
def policy_list(request: HttpRequest) -> HttpResponse:
    """Every pool's policy (the GPUs in no pool first), and the viewer's quota use."""
    rows = [(quotas.pool_key(policy.pool), policy) for policy in quotas.every_policy()]
    return render(
        request,
        "scheduling/policies.html",
        {"rows": rows, "can_edit": is_admin(request.user)},
    )


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def policy_edit(request: HttpRequest, pool: str) -> HttpResponse:
    """A pool's policy form; a valid POST changes it (audited) and returns to the list."""
    where = quotas.pool_named(pool)
    current = quotas.policy_of(where)
    form = PolicyForm(request.POST if request.method == "POST" else None, instance=current)
    if form.is_valid():
        try:
            policy_services.set_pool_policy(where, actor=signed_in(request), **policy_values(form))
        except policy_services.PolicyInvalid as exc:
            form.add_error(exc.field, exc.message)
        else:
            label = quotas.pool_label(where.name if where else None)
            messages.success(request, f"The policy of {label} is saved.")
            return redirect("policies:list")
    title = f"Policy of pool {where.name}" if where else "Policy of the GPUs in no pool"
    return _setting_form(request, form, title, reverse("policies:list"), "all policies")


@login_required
@require_GET
def quota_list(request: HttpRequest) -> HttpResponse:
    """The quotas the viewer may read, by pool and holder, ``QUOTA_PAGE_ROWS`` a page, each
    with what its holder uses now and this period (as the scheduler counts it)."""
    viewer = signed_in(request)
    rows = quotas.visible_quotas(viewer).order_by(
        F("pool__name").asc(nulls_first=True), "project", "user__username"
    )
    page = Paginator(rows, QUOTA_PAGE_ROWS).get_page(request.GET.get("page"))
    limits = quotas.limits_of(page, timezone.now())
    uses = [
        (quota, quotas.QuotaUse(quota.pk, limits[quota.pk], mine=quota.user_id == viewer.pk))
        for quota in page
    ]
    context = {"page": page, "uses": uses, "can_edit": is_admin(viewer)}
    return render(request, "scheduling/quotas.html", context)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def quota_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    """A new quota's form, or an existing one's (``pk``); a valid POST saves it through the
    audited services and returns to the list."""
    quota = get_object_or_404(Quota.objects.select_related("pool", "user"), pk=pk) if pk else None
    form = QuotaForm(request.POST if request.method == "POST" else None, instance=quota)
    if form.is_valid():
        try:
            if quota is None:
                quota = quotas.create_quota(actor=signed_in(request), **quota_values(form))
            else:
                quotas.update_quota(quota, actor=signed_in(request), **quota_values(form))
        except quotas.QuotaInvalid as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"The quota of {quota} is saved.")
            return redirect("policies:quotas")
    title = f"Quota of {quota}" if quota else "New quota"
    return _setting_form(request, form, title, reverse("policies:quotas"), "all quotas")


def _setting_form(
    request: HttpRequest, form: forms.BaseForm, title: str, back_url: str, back_label: str
) -> HttpResponse:
    """A setting's form page; a 400 while it shows errors."""
    context = {"form": form, "title": title, "back_url": back_url, "back_label": back_label}
    status = 400 if form.errors else 200
    return render(request, "scheduling/setting_form.html", context, status=status)


@role_required(Role.ADMIN)
@require_POST
def quota_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Remove a quota (audited): its holder is then unlimited in that pool."""
    quota = get_object_or_404(Quota.objects.select_related("pool", "user"), pk=pk)
    quotas.delete_quota(quota, actor=signed_in(request))
    messages.success(request, f"The quota of {quota} is removed.")
    return redirect("policies:quotas")


@login_required
@require_GET
def fairshare_page(request: HttpRequest) -> HttpResponse:
    """One pool's fair share (``?pool=``, ``~`` or nothing: the GPUs in no pool)."""
    key = request.GET.get("pool") or quotas.NO_POOL
    board = quotas.fairshare_board(quotas.pool_named(key), signed_in(request))
    pools = [quotas.NO_POOL, *Pool.objects.order_by("name").values_list("name", flat=True)]
    return render(
        request,
        "scheduling/fairshare.html",
        {
            "board": board,
            "key": key,
            "pools": pools,
            "half_life": duration_text(board.config.fairshare_half_life_s),
        },
    )

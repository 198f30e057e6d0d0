"""The policies page (each pool's policy; admins edit one through its form), the fair-share
page ("why is my priority what it is": everyone's share, decayed usage and factor in a pool,
and the viewer's explanation), and the viewer's quota use.

Everyone signed in reads both pages, like the usage page; changing a policy needs the admin
role and goes through ``admin_services.set_pool_policy`` (audited).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from gpuadmin.access.models import Role
from gpuadmin.access.permissions import role_required, signed_in
from gpuadmin.access.services import is_admin
from inventory.models import Pool
from scheduling import admin_services, quotas
from scheduling.pages import duration_text
from scheduling.policy_forms import PolicyForm, policy_values


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
            admin_services.set_pool_policy(where, actor=signed_in(request), **policy_values(form))
        except admin_services.PolicyInvalid as exc:
            form.add_error(exc.field, exc.message)
        else:
            label = quotas.pool_label(where.name if where else None)
            messages.success(request, f"The policy of {label} is saved.")
            return redirect("policies:list")
    status = 400 if form.errors else 200
    context = {"form": form, "pool": where, "key": pool}
    return render(request, "scheduling/policy_edit.html", context, status=status)


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
            "half_life": duration_text(round(board.config.fairshare_half_life_s)),
        },
    )

"""``{% my_usage %}``: the signed-in person's quotas with what they use ("you use 6 of 8 GPUs in
pool a100; 112 of 500 GPU-hours this month"), on the job form, the queue and the policy
pages."""

from __future__ import annotations

from typing import Any

from django import template

from scheduling.policies import quotas

register = template.Library()


@register.inclusion_tag("scheduling/partials/my_usage.html", takes_context=True)
def my_usage(context: template.Context) -> dict[str, Any]:
    user = context["request"].user
    return {"lines": quotas.usage_summary(user) if user.is_authenticated else []}

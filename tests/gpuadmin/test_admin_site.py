"""The admin site every model's admin shares: a hand-made list action's selection that is not
an id of the list's model goes back to the list with a message, for every registered model
(the auth app's too), instead of Django's 500."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import RequestFactory
from django.urls import reverse

from gpuadmin.admin_site import AdminSite, CheckedSelection

pytestmark = pytest.mark.django_db


def test_the_default_site_is_gpuadmins():
    assert isinstance(admin.site, AdminSite)
    assert admin.site.site_header == "gpuadmin"


# Every registered model but those whose list has no action at all (read-only, no delete).
NO_ACTIONS = {
    "audit.AuditEvent",
    "health.HealthEvent",
    "ray.RayJob",
    "scheduling.Allocation",
    "scheduling.PoolPolicy",
    "scheduling.SchedulerSettings",
    "scheduling.UsageDay",
}
LISTS = sorted(
    (model for model in admin.site._registry if model._meta.label not in NO_ACTIONS),
    key=lambda model: model._meta.label,
)


def test_every_registered_admin_checks_its_selection():
    assert all(isinstance(each, CheckedSelection) for each in admin.site._registry.values())


@pytest.mark.parametrize("selected", ["abc", "1\x00"])
@pytest.mark.parametrize("model", LISTS, ids=str)
def test_a_selection_that_is_no_id_is_refused_on_every_list(
    admin_client, admin_user, model, selected
):
    request = RequestFactory().get("/")
    request.user = admin_user
    actions = list(admin.site._registry[model].get_actions(request))
    assert actions, f"{model._meta.label} has no list action: add it to NO_ACTIONS"
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    body = {"action": actions[0], "_selected_action": [selected], "index": "0"}
    response = admin_client.post(url, body, follow=True)
    assert response.redirect_chain == [(url, 302)]
    assert "is not the id of a" in response.content.decode()

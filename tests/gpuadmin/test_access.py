"""One permission model for every app (``gpuadmin.access``): roles edited in the admin
(audited), tokens revoked there, and the permission classes' answers per role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from rest_framework.test import APIRequestFactory

from gpuadmin.access import permissions
from gpuadmin.access.models import ApiToken, Membership, Role, UnixAccount
from gpuadmin.access.services import create_token, role_of, set_unix_account, unix_account_of
from gpuadmin.audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_a_role_change_is_audited(admin_client, django_user_model):
    erin = django_user_model.objects.create_user("erin")
    response = admin_client.post(
        "/admin/access/membership/add/", {"user": erin.pk, "role": "operator"}
    )
    assert response.status_code == 302, response.content[:500]
    assert role_of(erin) == "operator"
    membership = Membership.objects.get(user=erin)
    admin_client.post(f"/admin/access/membership/{membership.pk}/delete/", {"post": "yes"})
    assert role_of(django_user_model.objects.get(pk=erin.pk)) == "user"
    changes = AuditEvent.objects.filter(event_type="membership.role_changed").order_by("pk")
    assert [(e.before["role"], e.after["role"]) for e in changes] == [
        (None, "operator"),
        ("operator", None),
    ]


def test_roles_deleted_from_the_list_are_audited_each(admin_client, django_user_model):
    people = [django_user_model.objects.create_user(name) for name in ("erin", "finn")]
    rows = [Membership.objects.create(user=person, role=Role.OPERATOR) for person in people]
    response = admin_client.post(
        "/admin/access/membership/",
        {"action": "delete_selected", "_selected_action": [row.pk for row in rows], "post": "yes"},
    )
    assert response.status_code == 302
    assert not Membership.objects.exists()
    changes = AuditEvent.objects.filter(event_type="membership.role_changed")
    assert sorted((e.before["user"], e.before["role"], e.after["role"]) for e in changes) == [
        ("erin", "operator", None),
        ("finn", "operator", None),
    ]


def test_people_made_admins_and_deleted_in_the_admin_are_audited(admin_client):
    added = admin_client.post(
        "/admin/auth/user/add/",
        {"username": "erin", "password1": "k3ep-it-s3cret!", "password2": "k3ep-it-s3cret!"},
    )
    assert added.status_code == 302, added.content.decode()[:3000]
    erin = User.objects.get(username="erin")
    form = {
        "username": "erin",
        "is_active": "on",
        "is_staff": "on",
        "date_joined_0": f"{erin.date_joined:%Y-%m-%d}",
        "date_joined_1": f"{erin.date_joined:%H:%M:%S}",
    }
    changed = admin_client.post(f"/admin/auth/user/{erin.pk}/change/", form)
    assert changed.status_code == 302, changed.content.decode()[:3000]
    assert role_of(User.objects.get(pk=erin.pk)) == "admin"
    admin_client.post(f"/admin/auth/user/{erin.pk}/delete/", {"post": "yes"})
    rows = AuditEvent.objects.filter(event_type__startswith="user.").order_by("pk")
    facts = {"username": "erin", "is_active": True, "is_staff": False, "is_superuser": False}
    assert [(row.event_type, row.before, row.after) for row in rows] == [
        ("user.created", None, facts),
        ("user.changed", {"is_staff": False}, {"is_staff": True}),
        ("user.deleted", {**facts, "is_staff": True}, None),
    ]


def test_a_persons_unix_account_defaults_to_their_name_and_admins_change_it_audited(
    admin_client, django_user_model
):
    erin = django_user_model.objects.create_user("erin")
    assert (unix_account_of(erin).username, unix_account_of(erin).allow_root) == ("erin", False)

    response = admin_client.post(
        "/admin/access/unixaccount/add/", {"user": erin.pk, "username": "ekim", "allow_root": "on"}
    )
    assert response.status_code == 302, response.content[:500]
    account = UnixAccount.objects.get(user=erin)
    admin_client.post(
        f"/admin/access/unixaccount/{account.pk}/change/", {"username": "ekim", "allow_root": ""}
    )
    admin_client.post(f"/admin/access/unixaccount/{account.pk}/delete/", {"post": "yes"})

    erin = django_user_model.objects.get(pk=erin.pk)
    assert (unix_account_of(erin).username, unix_account_of(erin).allow_root) == ("erin", False)
    changes = AuditEvent.objects.filter(event_type="unix_account.changed").order_by("pk")
    assert [(e.actor_name, e.before, e.after) for e in changes] == [
        (
            "admin",
            {"user": "erin", "username": "erin", "allow_root": False},
            {"user": "erin", "username": "ekim", "allow_root": True},
        ),
        (
            "admin",
            {"user": "erin", "username": "ekim", "allow_root": True},
            {"user": "erin", "username": "ekim", "allow_root": False},
        ),
        (
            "admin",
            {"user": "erin", "username": "ekim", "allow_root": False},
            {"user": "erin", "username": "erin", "allow_root": False},
        ),
    ]


def test_people_an_admin_gave_no_account_run_as_the_default_one(
    settings, admin_user, django_user_model
):
    """`gpuadmin up` as root: everyone's demo jobs run as the account it made for them."""
    settings.GPUADMIN_DEFAULT_UNIX_ACCOUNT = "gpuadmin-job"
    erin = django_user_model.objects.create_user("erin")
    assert (unix_account_of(erin).username, unix_account_of(erin).allow_root) == (
        "gpuadmin-job",
        False,
    )
    set_unix_account(erin, username="ekim", allow_root=False, actor=admin_user)
    erin = django_user_model.objects.get(pk=erin.pk)
    assert unix_account_of(erin).username == "ekim"


@pytest.mark.parametrize("name", ["-oProxy", "../etc", "a b", "x" * 33, "", "é"])
def test_a_unix_user_name_is_refused_naming_the_field(admin_user, django_user_model, name):
    erin = django_user_model.objects.create_user("erin")
    with pytest.raises(ValidationError) as refused:
        set_unix_account(erin, username=name, allow_root=False, actor=admin_user)
    assert "username" in refused.value.message_dict
    assert not UnixAccount.objects.exists()
    assert not AuditEvent.objects.filter(event_type="unix_account.changed").exists()


def test_tokens_are_revoked_from_the_admin(admin_client, admin_user):
    token, _ = create_token(admin_user, "laptop")
    assert '/admin/access/apitoken/">API tokens</a>' in admin_client.get("/admin/").content.decode()
    admin_client.post(
        "/admin/access/apitoken/", {"action": "revoke_tokens", "_selected_action": [token.pk]}
    )
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert AuditEvent.objects.filter(event_type="token.revoked").count() == 1


# What each role may do through the classes every app's API uses: (read, write).
EXPECTED = {
    permissions.CanSubmit: {"admin": (1, 1), "operator": (1, 1), "user": (1, 1), "viewer": (1, 0)},
    permissions.IsOperatorOrReadOnly: {
        "admin": (1, 1),
        "operator": (1, 1),
        "user": (1, 0),
        "viewer": (1, 0),
    },
    permissions.IsAdminOrReadOnly: {
        "admin": (1, 1),
        "operator": (1, 0),
        "user": (1, 0),
        "viewer": (1, 0),
    },
    permissions.IsAdminRole: {
        "admin": (1, 1),
        "operator": (0, 0),
        "user": (0, 0),
        "viewer": (0, 0),
    },
}


@pytest.mark.parametrize("permission", list(EXPECTED), ids=lambda cls: cls.__name__)
def test_permission_classes_answer_by_role_not_by_staff(permission, django_user_model):
    factory = APIRequestFactory()
    answers = {}
    for role in Role.values:
        person = django_user_model.objects.create_user(f"{permission.__name__}-{role}")
        Membership.objects.create(user=person, role=role)
        verdicts = []
        for method in ("get", "post"):
            request = getattr(factory, method)("/")
            request.user = person
            verdicts.append(int(permission().has_permission(request, None)))
        answers[role] = tuple(verdicts)
    assert answers == EXPECTED[permission]
    anonymous = factory.get("/")
    anonymous.user = type("Anonymous", (), {"is_authenticated": False})()
    assert not permission().has_permission(anonymous, None)

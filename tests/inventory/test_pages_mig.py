"""MIG page: profile availability from the catalog table and the current placements, and the
admins' create/destroy forms (wired to ``inventory.services``)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from gpuadmin.access.models import Membership, Role
from inventory import services
from inventory.models import Gpu, MigInstance
from inventory.pages.mig import mig_layout
from tests.inventory.pages import add_node, unique_host

A100_40GB = "NVIDIA A100-SXM4-40GB"


def instances(*placed: tuple[str, int, int]) -> list[MigInstance]:
    """Unsaved instances (profile, memory-slice start, size), one GPU instance each."""
    return [
        MigInstance(
            gi_id=gi_id,
            ci_id=0,
            profile_name=name,
            ci_profile_name=name,
            profile_id=0,
            placement_start=start,
            placement_size=size,
            memory_mib=4864 * size,
            sm_count=14,
        )
        for gi_id, (name, start, size) in enumerate(placed, start=1)
    ]


def fits(*placed: tuple[str, int, int], gpu_name: str = A100_40GB) -> dict[str, tuple[int, list]]:
    layout = mig_layout(Gpu(name=gpu_name, mig_capable=True, mig_enabled=True), instances(*placed))
    return {fit.name: (fit.fits, fit.starts) for fit in layout.fits}


def test_an_empty_a100_fits_every_profile_its_table_allows():
    assert fits() == {
        "1g.5gb": (7, [0, 1, 2, 3, 4, 5, 6]),
        "1g.5gb+me": (1, [0]),
        "1g.10gb": (4, [0, 2, 4, 6]),
        "2g.10gb": (3, [0, 2, 4]),
        "3g.20gb": (2, [0, 4]),
        "4g.20gb": (1, [0]),
        "7g.40gb": (1, [0]),
    }


def test_placements_and_compute_slices_limit_what_fits():
    # 4g.20gb on slices 0-3 leaves 3 compute slices and memory slices 4-7.
    assert fits(("4g.20gb", 0, 4)) == {
        "1g.5gb": (3, [4, 5, 6]),
        "1g.5gb+me": (1, [4]),
        "1g.10gb": (2, [4, 6]),
        "2g.10gb": (1, [4]),
        "3g.20gb": (1, [4]),
        "4g.20gb": (0, []),
        "7g.40gb": (0, []),
    }
    # 3g.20gb + 2g.10gb: slices 6-7 are free, but a 1g.5gb can never sit on slice 7.
    after = fits(("3g.20gb", 0, 4), ("2g.10gb", 4, 2))
    assert after["1g.5gb"] == (1, [6]) and after["1g.10gb"] == (1, [6])
    assert after["2g.10gb"] == (0, [])
    # Five 1g.5gb on 0-4: two more fit (5 and 6).
    assert fits(*[("1g.5gb", n, 1) for n in range(5)])["1g.5gb"] == (2, [5, 6])


def test_a_gpu_with_mig_off_lists_no_room():
    layout = mig_layout(Gpu(name=A100_40GB, mig_capable=True, mig_enabled=False), [])
    assert (layout.known_table, layout.fits) == (True, [])


def test_media_extension_profile_is_limited_to_one_instance():
    assert fits(("1g.5gb+me", 0, 1))["1g.5gb+me"] == (0, [])


def test_layout_is_drawn_on_eight_memory_slices():
    layout = mig_layout(
        Gpu(name=A100_40GB, mig_capable=True), instances(("3g.20gb", 4, 4), ("2g.10gb", 0, 2))
    )
    assert (layout.memory_slices, layout.compute_slices, layout.compute_used) == (8, 7, 5)
    assert [card.grid_column for card in layout.cards] == ["1 / span 2", "5 / span 4"]
    assert layout.free_slices == [2, 3]
    assert layout.compute_bar == [True] * 5 + [False] * 2


def test_an_a30_is_drawn_on_its_four_memory_slices():
    # The A30 capture's layout (tests/nvml/captures/mig__code-index-25510043945__A30__*):
    # 1g.6gb at 0 and 1, 2g.12gb at 2.
    placed = (("1g.6gb", 0, 1), ("1g.6gb", 1, 1), ("2g.12gb", 2, 2))
    layout = mig_layout(Gpu(name="NVIDIA A30", mig_capable=True), instances(*placed))
    assert (layout.memory_slices, layout.compute_slices, layout.compute_used) == (4, 4, 4)
    assert [card.grid_column for card in layout.cards] == ["1 / span 1", "2 / span 1", "3 / span 2"]
    assert layout.free_slices == [] and list(layout.slice_indexes) == [0, 1, 2, 3]
    assert fits(("1g.6gb", 0, 1), gpu_name="NVIDIA A30") == {
        "1g.6gb": (3, [1, 2, 3]),
        "1g.6gb+me": (1, [1]),
        "2g.12gb": (1, [2]),
        "2g.12gb+me": (1, [2]),
        "4g.24gb": (0, []),
    }


def test_a_gpu_without_a_table_draws_its_instances_and_fits_nothing():
    layout = mig_layout(Gpu(name="Some Future GPU", mig_capable=True), instances(("2g.24gb", 0, 2)))
    assert not layout.known_table and layout.fits == []
    assert [card.compute_slices for card in layout.cards] == [2]


# ------------------------------------------------------------------------ admin forms


@pytest.fixture
def mig_gpu(db) -> Gpu:
    host = unique_host()
    add_node(host)
    return Gpu.objects.get(node__hostname=host, index=0)


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    """Replace the MIG services (they need a node agent) with recorders."""
    made: list[tuple] = []

    def create(gpu, profile_name, *, actor, placement_start=None):
        made.append(("create", gpu.uuid, profile_name, placement_start, actor.username))
        return []

    def destroy(gpu, gi_id, *, actor):
        made.append(("destroy", gpu.uuid, gi_id, actor.username))
        if gi_id == 99:
            raise services.MigChangeRefused(
                f"GPU {gpu.index} has no GPU instance 99", "no_such_instance"
            )
        return []

    monkeypatch.setattr(services, "create_mig_instance", create)
    monkeypatch.setattr(services, "destroy_mig_instance", destroy)
    return made


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_admins_see_the_forms_and_others_do_not(client, admin_client, mig_gpu):
    page = f"/nodes/{mig_gpu.node.hostname}/mig/"
    assert f"/gpus/{mig_gpu.uuid}/mig/create/" in admin_client.get(page).content.decode()
    assert "/mig/create/" not in client.get(page).content.decode()


def test_admin_creates_an_instance(admin_client, mig_gpu, calls):
    response = admin_client.post(
        f"/gpus/{mig_gpu.uuid}/mig/create/", {"profile_name": "1g.5gb", "placement_start": "6"}
    )
    assert response.status_code == 302
    assert response["Location"] == f"/nodes/{mig_gpu.node.hostname}/mig/#mig-gpu0"
    assert calls == [("create", mig_gpu.uuid, "1g.5gb", 6, "admin")]
    assert messages_of(response) == ["Created a 1g.5gb instance on GPU 0."]


def test_unknown_profile_is_refused_before_calling_the_service(admin_client, mig_gpu, calls):
    response = admin_client.post(f"/gpus/{mig_gpu.uuid}/mig/create/", {"profile_name": "9g.1tb"})
    assert response.status_code == 302 and calls == []
    [message] = messages_of(response)
    assert message.startswith("GPU 0: ") and "9g.1tb is not one of the available choices" in message


def test_admin_destroys_an_instance_and_sees_a_refusal(admin_client, mig_gpu, calls):
    ok = admin_client.post(f"/gpus/{mig_gpu.uuid}/mig/2/destroy/")
    refused = admin_client.post(f"/gpus/{mig_gpu.uuid}/mig/99/destroy/")
    assert calls == [("destroy", mig_gpu.uuid, 2, "admin"), ("destroy", mig_gpu.uuid, 99, "admin")]
    assert messages_of(ok) == ["Destroyed GPU instance 2 of GPU 0."]
    # Nothing renders the first message in between, so the session still holds it.
    assert messages_of(refused)[-1] == (
        "GPU instance 99 of GPU 0 not destroyed: GPU 0 has no GPU instance 99"
    )


def test_a_refusal_shows_on_the_card_of_its_gpu(admin_client, mig_gpu, calls):
    response = admin_client.post(f"/gpus/{mig_gpu.uuid}/mig/99/destroy/", follow=True)
    html = response.content.decode()
    card = html.split('id="mig-gpu0"')[1].split("</section>")[0]
    assert '<li class="message error">GPU instance 99 of GPU 0 not destroyed' in card
    assert html.count("not destroyed") == 1  # not repeated at the top of the page


def with_role(django_user_model, role: str):
    """A person who is not staff, with ``role`` from their Membership."""
    user = django_user_model.objects.create_user(f"{role}-1", password="pw-123456789")
    Membership.objects.create(user=user, role=role)
    return user


def test_the_admin_role_changes_mig_without_being_staff(client, django_user_model, mig_gpu, calls):
    admin = with_role(django_user_model, Role.ADMIN)
    client.force_login(admin)
    page = client.get(f"/nodes/{mig_gpu.node.hostname}/mig/").content.decode()
    assert f"/gpus/{mig_gpu.uuid}/mig/create/" in page
    created = client.post(f"/gpus/{mig_gpu.uuid}/mig/create/", {"profile_name": "1g.5gb"})
    destroyed = client.post(f"/gpus/{mig_gpu.uuid}/mig/2/destroy/")
    assert (created.status_code, destroyed.status_code) == (302, 302)
    assert calls == [
        ("create", mig_gpu.uuid, "1g.5gb", None, admin.username),
        ("destroy", mig_gpu.uuid, 2, admin.username),
    ]


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.USER, Role.VIEWER])
def test_other_roles_cannot_change_mig(client, django_user_model, mig_gpu, calls, role):
    create_url = f"/gpus/{mig_gpu.uuid}/mig/create/"
    anonymous = client.post(create_url, {"profile_name": "1g.5gb"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    client.force_login(with_role(django_user_model, role))
    assert client.post(create_url, {"profile_name": "1g.5gb"}).status_code == 403
    assert client.post(f"/gpus/{mig_gpu.uuid}/mig/2/destroy/").status_code == 403
    assert client.get(create_url).status_code == 405
    assert "/mig/create/" not in client.get(f"/nodes/{mig_gpu.node.hostname}/mig/").content.decode()
    assert calls == []

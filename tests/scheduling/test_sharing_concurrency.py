"""The database guards shares under concurrent attempts (real PostgreSQL, one connection per
thread, all released at once): MPS shares never pass 100 % of a GPU (exactly the fitting ones
win), a MIG device is never given twice, and whole GPUs, MIG devices and MPS shares never mix
on one GPU. Half the attempts go through the ORM and half as raw INSERTs: the trigger decides,
not Python."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from inventory.models import Gpu, MigInstance
from scheduling.models import Allocation, Job
from tests.scheduling.conftest import add_sim_node

pytestmark = pytest.mark.django_db(transaction=True)

ATTEMPTS = 12


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def gpus(broker) -> list[Gpu]:
    add_sim_node("dgx-01", "dgx-a100-40gb")
    return list(Gpu.objects.filter(node__hostname="dgx-01").order_by("index"))


def insert(job: Job, gpu: Gpu, raw: bool, **fields: Any) -> None:
    """One allocation row, through the ORM or as a raw INSERT, committed after a pause that
    keeps the other attempts waiting on the GPU row's lock."""
    with transaction.atomic():
        if raw:
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO scheduling_allocation (job_id, gpu_id, node_id, kind,"
                    " mig_instance_id, device_uuid, mps_percent, mps_memory_mib, attempt, manual)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, false)",
                    [
                        job.pk,
                        gpu.pk,
                        gpu.node_id,
                        fields.get("kind", "gpu"),
                        fields.get("mig_instance_id"),
                        fields.get("device_uuid", ""),
                        fields.get("mps_percent"),
                        fields.get("mps_memory_mib"),
                    ],
                )
        else:
            Allocation.objects.create(job=job, gpu=gpu, node_id=gpu.node_id, attempt=1, **fields)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.02)")


def race(attempts: list[Callable[[], None]]) -> list[bool]:
    """Run every attempt at once, each in its own thread and connection; which succeeded."""
    barrier = threading.Barrier(len(attempts))
    won = [False] * len(attempts)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait()
            attempts[n]()
            won[n] = True
        except IntegrityError:
            pass
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(attempts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return won


def jobs(owner, count: int) -> list[Job]:
    return [Job.objects.create(owner=owner, command=["x"], state="scheduled") for _ in range(count)]


def test_mps_shares_never_pass_100_percent(owner, gpus):
    gpu = gpus[2]  # not in MIG mode
    Gpu.objects.filter(pk=gpu.pk).update(mps_shared=True)
    Allocation.objects.create(
        job=jobs(owner, 1)[0], gpu=gpu, node_id=gpu.node_id, kind="mps", mps_percent=10
    )
    contenders = jobs(owner, ATTEMPTS)
    won = race(
        [
            lambda job=job, n=n: insert(job, gpu, raw=n % 2 == 1, kind="mps", mps_percent=30)
            for n, job in enumerate(contenders)
        ]
    )
    assert sum(won) == 3  # 10 + 3 x 30 = 100: exactly the ones that fit
    active = Allocation.objects.active().filter(gpu=gpu)
    assert sum(active.values_list("mps_percent", flat=True)) == 100


def test_mps_memory_limits_never_pass_the_gpus_memory(owner, gpus):
    """The engine's other MPS rule, in the database too: a manual allocation racing the loop
    cannot over-book a GPU's memory with shares that each fit their percent."""
    gpu = gpus[2]
    Gpu.objects.filter(pk=gpu.pk).update(mps_shared=True, memory_total_mib=81920)
    quarter = 81920 // 4
    contenders = jobs(owner, ATTEMPTS)
    won = race(
        [
            lambda job=job, n=n: insert(
                job, gpu, raw=n % 2 == 1, kind="mps", mps_percent=10, mps_memory_mib=quarter
            )
            for n, job in enumerate(contenders)
        ]
    )
    assert sum(won) == 4  # 4 x 20480 MiB fill 80 GiB; 40 % of the SMs leave room to spare
    active = Allocation.objects.active().filter(gpu=gpu)
    assert sum(active.values_list("mps_memory_mib", flat=True)) == 81920
    with pytest.raises(IntegrityError, match="would pass its 81920 MiB"):
        insert(jobs(owner, 1)[0], gpu, raw=True, kind="mps", mps_percent=1, mps_memory_mib=1)
    # A share without a limit takes none.
    insert(jobs(owner, 1)[0], gpu, raw=False, kind="mps", mps_percent=10)


def test_a_mig_device_is_never_given_twice(owner, gpus):
    gpu = gpus[0]
    device = MigInstance.objects.filter(gpu=gpu).order_by("gi_id").first()
    contenders = jobs(owner, ATTEMPTS)
    won = race(
        [
            lambda job=job, n=n: insert(
                job,
                gpu,
                raw=n % 2 == 1,
                kind="mig",
                mig_instance_id=device.pk,
                device_uuid=device.uuid,
            )
            for n, job in enumerate(contenders)
        ]
    )
    assert sum(won) == 1
    assert Allocation.objects.active().filter(mig_instance=device).count() == 1


@pytest.mark.parametrize("rounds", range(3))
def test_whole_gpus_mig_devices_and_mps_shares_never_mix(owner, gpus, rounds):
    """A MIG-mode GPU (so it has devices), raced by every kind at once: the winners are all of
    one kind, and a whole GPU wins alone."""
    gpu = gpus[0]
    devices = list(MigInstance.objects.filter(gpu=gpu).order_by("gi_id"))
    kinds: list[dict[str, Any]] = [
        {"kind": "gpu"},
        {"kind": "mps", "mps_percent": 20},
        *({"kind": "mig", "mig_instance_id": d.pk, "device_uuid": d.uuid} for d in devices),
    ]
    attempts = [kinds[n % len(kinds)] for n in range(ATTEMPTS)]
    contenders = jobs(owner, ATTEMPTS)
    won = race(
        [
            lambda job=job, fields=fields, n=n: insert(
                job, gpu, raw=(n + rounds) % 2 == 1, **fields
            )
            for n, (job, fields) in enumerate(zip(contenders, attempts, strict=True))
        ]
    )
    winners = [fields["kind"] for fields, ok in zip(attempts, won, strict=True) if ok]
    assert len(set(winners)) == 1, winners
    active = list(Allocation.objects.active().filter(gpu=gpu).values_list("kind", flat=True))
    assert sorted(active) == sorted(winners)
    if winners[0] == "gpu":
        assert winners == ["gpu"]
    if winners[0] == "mig":
        assert len(winners) == len(devices)  # each device once, every device given


def test_the_guard_refuses_mixing_after_the_fact(owner, gpus):
    """Sequentially too, and a released row frees its room."""
    gpu = gpus[2]
    first, second, third = jobs(owner, 3)
    whole = Allocation.objects.create(job=first, gpu=gpu, node_id=gpu.node_id)
    with pytest.raises(IntegrityError, match="already allocated"):
        insert(second, gpu, raw=True, kind="mps", mps_percent=5)
    whole.released_at = whole.allocated_at
    whole.save(update_fields=["released_at"])
    insert(second, gpu, raw=False, kind="mps", mps_percent=60)
    with pytest.raises(IntegrityError, match="would pass 100"):
        insert(third, gpu, raw=True, kind="mps", mps_percent=41)
    with pytest.raises(IntegrityError, match="already allocated"):
        insert(third, gpu, raw=False, kind="gpu")

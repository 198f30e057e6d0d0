"""MIG and MPS placement (scheduling/placement/sharing.py) on hand-built fleets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inventory.nvml.sim import mig as sim_mig
from scheduling.placement import (
    Fcfs,
    MigCreate,
    Placement,
    PoolConfig,
    Reason,
    ReservationWindow,
    plan,
)
from scheduling.placement.sharing import SharingPass, is_sharing, unusable_gpus
from tests.scheduling.placement.builders import A100_40, A100_80, GB, H100, NOW, job
from tests.scheduling.placement.sharing_builders import (
    Shares,
    mig_job,
    mps_job,
    sim_block,
    table_of,
)

DYNAMIC = PoolConfig(dynamic_mig=True)


def placement(result: Placement | MigCreate | None) -> Placement:
    assert isinstance(result, Placement), result
    return result


def create(result: Placement | MigCreate | None) -> MigCreate:
    assert isinstance(result, MigCreate), result
    return result


# ---------------------------------------------------------------------- MIG devices


def test_a_mig_job_gets_a_free_device_of_its_profile() -> None:
    fleet = Shares()
    gpu = fleet.mig("dgx-01", [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)])
    _, [result] = fleet.place(mig_job(1, "2g.10gb"))
    given = placement(result)
    assert given.by_node == (("dgx-01", (gpu.id,)),)
    assert fleet.slot(given.mig_slot or 0).profile == "2g.10gb"
    assert given.mps_percent is None
    assert given.explanation == (
        "MIG device 2g.10gb on dgx-01 GPU 0 (memory slices 4-5); "
        "leaves free: 1g.5gb and 4g.20gb on that GPU"
    )


def test_no_device_is_given_twice_nor_one_already_in_use() -> None:
    fleet = Shares()
    fleet.mig("dgx-01", [("3g.20gb", 0, 900), ("3g.20gb", 4)])
    fleet.mig("dgx-02", [("3g.20gb", 0), ("3g.20gb", 4)])
    sharing, results = fleet.place(*(mig_job(i, "3g.20gb") for i in range(1, 6)))
    slots = [placement(r).mig_slot for r in results[:3]]
    assert len(set(slots)) == 3
    assert all(fleet.slot(s or 0).allocated_to is None for s in slots)
    assert results[3:] == [None, None]
    waiting = sharing.explain(mig_job(4, "3g.20gb"), 1)
    assert waiting.reason == Reason.SHARE_UNAVAILABLE
    assert waiting.message == (
        "needs a free 3g.20gb MIG device; GPUs in MIG mode with that profile: 2, all in use; "
        "dynamic MIG is off outside pools"
    )


def test_best_fit_fills_the_busy_gpu_and_keeps_the_idle_one_whole() -> None:
    fleet = Shares()
    idle = fleet.mig("dgx-01", [("3g.20gb", 0), ("3g.20gb", 4)])
    busy = fleet.mig("dgx-02", [("3g.20gb", 0, 900), ("3g.20gb", 4)])
    for packing in ("fragmentation", "best-fit"):
        _, [result] = fleet.place(mig_job(1, "3g.20gb"), packing=packing)
        assert placement(result).gpu_ids == (busy.id,), packing
    # First fit takes the first GPU in hostname order.
    _, [result] = fleet.place(mig_job(1, "3g.20gb"), packing="first-fit")
    assert placement(result).gpu_ids == (idle.id,)


def test_a_small_device_goes_where_it_does_not_lock_an_idle_gpu() -> None:
    """In a dynamic-MIG pool an idle GPU can still be laid out anew; a 1g job on it would lock
    its six other slices until the job ends. The GPU already in use takes it."""
    fleet = Shares(pools={None: DYNAMIC})
    fleet.mig("dgx-01", [("1g.10gb", 6)], A100_80)
    busy = fleet.mig("dgx-02", [("4g.40gb", 0, 900), ("1g.10gb", 4), ("1g.10gb", 6)], A100_80)
    _, [result] = fleet.place(mig_job(1, "1g.10gb"))
    given = placement(result)
    assert given.gpu_ids == (busy.id,)
    assert fleet.slot(given.mig_slot or 0).placement_start == 4


def test_pools_are_respected() -> None:
    fleet = Shares()
    fleet.mig("dgx-01", [("3g.20gb", 0), ("3g.20gb", 4)], pool="vision")
    mine = fleet.mig("dgx-02", [("3g.20gb", 0), ("3g.20gb", 4)], pool="nlp")
    _, results = fleet.place(*(mig_job(i, "3g.20gb", pool="nlp") for i in (1, 2, 3)))
    assert [placement(r).gpu_ids for r in results[:2]] == [(mine.id,), (mine.id,)]
    assert results[2] is None
    waiting = fleet.pending(mig_job(4, "3g.20gb", pool="speech"))
    assert waiting.reason == Reason.MODEL
    assert waiting.message == (
        "no GPU in MIG mode in pool speech offers the 3g.20gb profile; "
        "they are in pool nlp and pool vision"
    )
    # The GPUs in no pool are a pool of their own.
    assert fleet.pending(mig_job(5, "3g.20gb")).message == (
        "no GPU in MIG mode outside pools offers the 3g.20gb profile; "
        "they are in pool nlp and pool vision"
    )


def test_a_requested_model_is_honoured() -> None:
    fleet = Shares()
    fleet.mig("dgx-a", [("1g.10gb", 0)], A100_80)
    h100 = fleet.mig("dgx-h", [("1g.10gb", 0)], H100)
    _, [result] = fleet.place(mig_job(1, "1g.10gb", gpu_model=H100))
    assert placement(result).gpu_ids == (h100.id,)
    waiting = fleet.pending(mig_job(2, "1g.5gb", gpu_model=H100))
    assert waiting.reason == Reason.MODEL
    assert waiting.message == (f"no {H100} GPU in MIG mode outside pools offers the 1g.5gb profile")


def test_broken_gpus_and_unavailable_nodes_take_nothing() -> None:
    fleet = Shares()
    fleet.mig("dgx-01", [("7g.40gb", 0)], unavailable="error")
    fleet.node("dgx-02", state="draining")
    fleet.mig("dgx-02", [("7g.40gb", 0)])
    sharing, [result] = fleet.place(mig_job(1, "7g.40gb"))
    assert result is None
    waiting = sharing.explain(mig_job(1, "7g.40gb"), 3)
    assert (waiting.position, waiting.reason) == (3, Reason.NODES_UNAVAILABLE)
    assert waiting.message == (
        "needs a 7g.40gb MIG device; the GPUs in MIG mode that offer it are unavailable "
        "(draining, error): dgx-01 GPU 0 and dgx-02 GPU 0"
    )


def test_the_estimated_start_is_when_a_device_of_the_profile_frees_up() -> None:
    fleet = Shares(ends={900: NOW + 3600, 901: NOW + 600})
    fleet.mig("dgx-01", [("3g.20gb", 0, 900), ("3g.20gb", 4, 901)])
    fleet.mig("dgx-02", [("4g.20gb", 0, 902), ("2g.10gb", 4)])
    waiting = fleet.pending(mig_job(1, "3g.20gb"))
    assert waiting.estimated_start == NOW + 600
    assert waiting.what_if == "with a 2g.10gb MIG device instead it could start now"
    # Nothing of the profile will ever free up: no estimate.
    assert fleet.pending(mig_job(2, "4g.20gb")).estimated_start is None


# ---------------------------------------------------------------------- dynamic MIG


@pytest.mark.parametrize(
    ("model", "profile", "start"),
    [
        # NVML's own choices on an empty GPU (MIG user guide): the small instance goes last,
        # so the 4g block at 0 stays whole; a 3g.* goes to 4 for the same reason.
        (A100_40, "1g.5gb", 6),
        (A100_40, "2g.10gb", 4),
        (A100_40, "3g.20gb", 4),
        (A100_40, "7g.40gb", 0),
        (A100_80, "1g.20gb", 6),
        (A100_80, "3g.40gb", 4),
        (H100, "1g.10gb", 6),
        (H100, "3g.40gb", 4),
        (H100, "4g.40gb", 0),
    ],
)
def test_dynamic_mig_creates_the_instance_where_it_keeps_large_blocks(
    model: str, profile: str, start: int
) -> None:
    fleet = Shares(pools={None: DYNAMIC})
    gpu = fleet.mig("dgx-01", [], model)
    _, [result] = fleet.place(mig_job(1, profile))
    created = create(result)
    assert (created.gpu_id, created.profile, created.placement_start) == (gpu.id, profile, start)
    # The simulator, which enforces NVML's rules, accepts it.
    table = table_of(model)
    sim_mig.create_gpu_instance(table, sim_block(table, []), table.by_name(profile).id, start)


def test_dynamic_mig_prefers_the_idle_gpu_that_already_holds_a_matching_block() -> None:
    """A 3g.40gb fits next to the 4g.40gb of dgx-01; the empty GPU stays whole for a 7g."""
    fleet = Shares(pools={None: DYNAMIC})
    empty = fleet.mig("dgx-00", [], H100)
    half = fleet.mig("dgx-01", [("4g.40gb", 0)], H100)
    sharing, [result, seven] = fleet.place(mig_job(1, "3g.40gb"), mig_job(2, "7g.80gb"))
    assert (create(result).gpu_id, create(result).placement_start) == (half.id, 4)
    assert (create(seven).gpu_id, create(seven).placement_start) == (empty.id, 0)
    assert sharing.explain(mig_job(1, "3g.40gb"), 1).reason == Reason.MIG_RECONFIGURING
    assert sharing.explain(mig_job(1, "3g.40gb"), 1).message == (
        "a 3g.40gb MIG instance is being created for it on dgx-01 GPU 0 (dynamic MIG)"
    )


def test_a_free_device_is_used_before_any_instance_is_created() -> None:
    fleet = Shares(pools={None: DYNAMIC})
    fleet.mig("dgx-01", [], A100_40)
    busy = fleet.mig("dgx-02", [("4g.20gb", 0, 900), ("1g.5gb", 6)], A100_40)
    _, [result] = fleet.place(mig_job(1, "1g.5gb"))
    assert placement(result).gpu_ids == (busy.id,)


def test_dynamic_mig_never_touches_a_gpu_with_work_on_it() -> None:
    fleet = Shares(pools={None: DYNAMIC}, ends={900: NOW + 1800})
    # Room for a 3g.20gb at 4, but a job runs on the 3g.20gb at 0.
    fleet.mig("dgx-01", [("3g.20gb", 0, 900)])
    sharing, [result] = fleet.place(mig_job(1, "3g.20gb"))
    assert result is None
    waiting = sharing.explain(mig_job(1, "3g.20gb"), 1)
    assert waiting.reason == Reason.SHARE_UNAVAILABLE
    assert waiting.message == (
        "needs a free 3g.20gb MIG device; GPUs in MIG mode with that profile: 1, all in use; "
        "dynamic MIG is on outside pools, but every GPU in MIG mode there has work on it"
    )
    # When that job ends the GPU is idle and has room for one.
    assert waiting.estimated_start == NOW + 1800


def test_a_gpu_given_work_in_the_pass_is_not_reconfigured_in_it() -> None:
    fleet = Shares(pools={None: DYNAMIC})
    gpu = fleet.mig("dgx-01", [("3g.20gb", 0)])
    _, [first, second] = fleet.place(mig_job(1, "3g.20gb"), mig_job(2, "3g.20gb"))
    assert placement(first).gpu_ids == (gpu.id,)
    assert second is None


def test_at_most_one_instance_is_created_per_gpu_per_pass() -> None:
    fleet = Shares(pools={None: DYNAMIC})
    gpu = fleet.mig("dgx-01", [], H100)
    sharing, results = fleet.place(mig_job(1, "1g.10gb"), mig_job(2, "1g.10gb"))
    assert create(results[0]).gpu_id == gpu.id
    assert results[1] is None
    assert sharing.explain(mig_job(2, "1g.10gb"), 1).message == (
        "needs a free 1g.10gb MIG device; GPUs in MIG mode with that profile: 1, all in use; "
        "dynamic MIG is on outside pools, but every GPU in MIG mode there has work on it"
    )


@pytest.mark.parametrize(
    ("model", "devices", "profile", "start"),
    [
        # Memory slices 4-5 are taken: a 1g.5gb has slices 6 and 7 left, but starts only at 6.
        (A100_40, [("4g.20gb", 0), ("2g.10gb", 4)], "1g.5gb", 6),
        # 3g.20gb + 3g.20gb use all 8 memory slices: the seventh compute slice stays unusable.
        (A100_40, [("3g.20gb", 0), ("3g.20gb", 4)], "1g.5gb", None),
        # 4 + 2 + 1 compute slices use them all; a 1g.20gb would need memory slices 6-7.
        (H100, [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], "1g.20gb", None),
        # An H100 1g.10gb never starts at memory slice 7.
        (H100, [("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)], "1g.10gb", None),
        # An A100-80GB 1g.20gb spans two memory slices, at even starts only.
        (A100_80, [("3g.40gb", 0), ("1g.10gb", 4)], "1g.20gb", 6),
        (A100_80, [("3g.40gb", 0), ("1g.10gb", 6)], "1g.20gb", 4),
        (A100_80, [("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 6)], "1g.20gb", None),
        (A100_80, [("1g.10gb", 6)], "7g.80gb", None),
    ],
)
def test_dynamic_mig_follows_each_models_placement_rules(
    model: str, devices: list[tuple[str, int]], profile: str, start: int | None
) -> None:
    fleet = Shares(pools={None: DYNAMIC})
    fleet.mig("dgx-01", devices, model)
    sharing, [result] = fleet.place(mig_job(1, profile))
    if start is None:
        assert result is None
        assert sharing.explain(mig_job(1, profile), 1).message.endswith(
            f"dynamic MIG is on outside pools, but none of the 1 idle GPU in MIG mode has room "
            f"for a {profile} instance next to its instances"
        )
    else:
        assert create(result).placement_start == start


def test_dynamic_mig_is_per_pool() -> None:
    fleet = Shares(pools={"lab": DYNAMIC})
    fleet.mig("dgx-01", [], pool="lab")
    fleet.mig("dgx-02", [])
    _, [in_lab, outside] = fleet.place(mig_job(1, "2g.10gb", pool="lab"), mig_job(2, "2g.10gb"))
    assert isinstance(in_lab, MigCreate)
    assert outside is None


# ---------------------------------------------------------------------- MPS


def test_an_mps_job_gets_a_share_and_packs_onto_the_fullest_gpu() -> None:
    fleet = Shares()
    fleet.mps("node-01")
    fuller = fleet.mps("node-02", [(900, 50, 20 * GB)])
    _, [result] = fleet.place(mps_job(1, 30, 10 * GB))
    given = placement(result)
    assert given.gpu_ids == (fuller.id,)
    assert (given.mps_percent, given.mps_memory_mib, given.mig_slot) == (30, 10 * GB, None)
    assert given.explanation == (
        "an MPS share of 30 % and 10 GiB on node-02 GPU 0; least fragmentation: leaves 20 % "
        "and 50 GiB free on that GPU"
    )


def test_mps_shares_never_pass_100_percent_nor_the_memory() -> None:
    fleet = Shares()
    gpu = fleet.mps("node-01", [(900, 40, 0)])
    sharing, results = fleet.place(mps_job(1, 30), mps_job(2, 30), mps_job(3, 10))
    assert [placement(r).gpu_ids for r in results[:2]] == [(gpu.id,), (gpu.id,)]
    assert results[2] is None
    waiting = sharing.explain(mps_job(3, 10), 1)
    assert waiting.reason == Reason.SHARE_UNAVAILABLE
    assert waiting.message == (
        "needs an MPS share of 10 % of one GPU; 1 MPS GPU outside pools, "
        "the most free on one is 0 %"
    )
    fleet = Shares()
    fleet.mps("node-01", [(900, 10, 70 * GB)])
    waiting = fleet.pending(mps_job(1, 10, 20 * GB))
    assert waiting.message == (
        "needs an MPS share of 10 % with 20 GiB of one GPU; 1 MPS GPU outside pools, "
        "none has 20 GiB free (the most is 10 GiB)"
    )
    # An 8000 MiB limit reads as set, in the unit NVML and nvidia-smi count in (not "7.8 GB").
    fleet = Shares()
    fleet.mps("node-01", [(900, 10, 75 * GB)])
    waiting = fleet.pending(mps_job(1, 10, 8000))
    assert waiting.message == (
        "needs an MPS share of 10 % with 8000 MiB of one GPU; 1 MPS GPU outside pools, "
        "none has 8000 MiB free (the most is 5 GiB)"
    )


def test_fragmentation_keeps_room_for_the_shares_the_queue_asks_for() -> None:
    """The queue asks for 50 % shares. Best fit puts a 20 % share on the 60 % GPU and leaves
    40 % there that no 50 % share can use; FGD puts it on the 70 % GPU, and both GPUs still
    take a 50 % share."""
    fleet = Shares(queue=[mps_job(i, 50) for i in range(10, 14)])
    roomier = fleet.mps("node-01", [(900, 30, 0)])
    fuller = fleet.mps("node-02", [(901, 40, 0)])
    small = mps_job(1, 20)
    fgd, [result] = fleet.place(small)
    assert placement(result).gpu_ids == (roomier.id,)
    best_fit, [result] = fleet.place(small, packing="best-fit")
    assert placement(result).gpu_ids == (fuller.id,)
    assert fgd.unusable_gpus() == 0
    # 40 % left on node-02: the 50 % shares (4 of the 5 requests) cannot use it.
    assert best_fit.unusable_gpus() == pytest.approx(0.4 * 4 / 5)


def test_mps_pools_models_and_broken_gpus() -> None:
    fleet = Shares(ends={900: NOW + 900})
    fleet.mps("node-01", pool="a")
    fleet.mps("node-02", [(900, 100, 0)], pool="b")
    fleet.mps("node-03", [(901, 20, 0)], unavailable="offline", pool="c")
    fleet.mps("node-04", pool="c", unavailable="mps")
    fleet.node("node-04", state="offline")
    assert fleet.pending(mps_job(1, 10, pool="z")).message == (
        "no GPU in pool z is shared by MPS; they are in pool a, pool b and pool c"
    )
    assert fleet.pending(mps_job(1, 10, pool="a", gpu_model=H100)).reason == Reason.MODEL
    waiting = fleet.pending(mps_job(1, 10, pool="b"))
    assert (waiting.reason, waiting.estimated_start) == (Reason.SHARE_UNAVAILABLE, NOW + 900)
    waiting = fleet.pending(mps_job(1, 10, 90 * GB, pool="a"))
    assert waiting.reason == Reason.MEMORY
    assert waiting.message == (
        "needs an MPS share of 10 % with 90 GiB; no GPU shared by MPS in pool a has that much "
        "memory, the largest has 80 GiB"
    )
    waiting = fleet.pending(mps_job(1, 10, pool="c"))
    assert waiting.reason == Reason.NODES_UNAVAILABLE
    assert waiting.message == (
        "needs an MPS share of 10 %; the MPS GPUs in pool c are unavailable (offline): "
        "node-03 GPU 0 and node-04 GPU 0"
    )
    _, [result] = fleet.place(mps_job(1, 10, pool="a"))
    assert placement(result).nodes == ("node-01",)


def test_mps_what_if_names_the_largest_share_that_fits() -> None:
    fleet = Shares()
    fleet.mps("node-01", [(900, 70, 0)])
    assert fleet.pending(mps_job(1, 50)).what_if == "with a share of 30 % it could start now"


# ---------------------------------------------------------------------- the measure


def test_unusable_gpus_is_the_free_capacity_the_waiting_mix_cannot_use() -> None:
    fleet = Shares(queue=[mig_job(10, "3g.20gb"), mps_job(11, 50), mps_job(12, 20)])
    # 7 compute slices free, a 3g.20gb can use 6 of them (two devices): 1/7 GPU.
    fleet.mig("dgx-01", [("3g.20gb", 0), ("3g.20gb", 4)])
    # 40 % free: the 20 % share fits, the 50 % does not (half the mix): 0.2 GPU.
    fleet.mps("node-01", [(900, 60, 0)])
    # A broken GPU is not fragmentation.
    fleet.mps("node-02", unavailable="error")
    assert unusable_gpus(fleet.snapshot()) == pytest.approx(1 / 7 + 0.2)
    # Against another mix.
    assert unusable_gpus(fleet.snapshot(), [mps_job(1, 50)]) == pytest.approx(0.4)
    assert unusable_gpus(fleet.snapshot(), [mps_job(1, 30)]) == 0
    assert unusable_gpus(fleet.snapshot(), []) == 0


def test_an_idle_gpu_of_a_dynamic_pool_counts_the_instances_it_could_still_get() -> None:
    fleet = Shares(queue=[mig_job(10, "4g.20gb")])
    fleet.mig("dgx-01", [])
    # Without dynamic MIG nothing can ever be created on it: all 7 slices are lost.
    assert unusable_gpus(fleet.snapshot()) == pytest.approx(1)
    fleet.pools[None] = DYNAMIC
    # One 4g.20gb fits: 3 of the 7 slices are left for nobody in this mix.
    assert unusable_gpus(fleet.snapshot()) == pytest.approx(3 / 7)


# ---------------------------------------------------------------------- contract


def test_is_sharing() -> None:
    assert is_sharing(mig_job(1, "1g.5gb"))
    assert is_sharing(mps_job(1, 10))
    assert not is_sharing(job(1))


def test_place_refuses_whole_gpu_jobs_and_unknown_packings() -> None:
    fleet = Shares()
    with pytest.raises(ValueError, match="whole GPUs"):
        fleet.sharing().place(job(1))
    with pytest.raises(ValueError, match="unknown packing"):
        SharingPass(fleet.snapshot(), packing="random")  # type: ignore[arg-type]


def test_the_same_snapshot_gives_the_same_choices_whatever_the_gpu_order() -> None:
    fleet = Shares(pools={None: DYNAMIC})
    for host in ("dgx-03", "dgx-01", "dgx-02"):
        fleet.mig(host, [("3g.20gb", 0), ("3g.20gb", 4)])
        fleet.mig(host, [])
        fleet.mps(host)
    jobs = [mig_job(1, "3g.20gb"), mig_job(2, "1g.5gb"), mps_job(3, 10), mps_job(4, 90)]
    _, forward = fleet.place(*jobs)
    fleet.gpus.reverse()
    _, backward = fleet.place(*jobs)
    assert forward == backward
    # The three nodes tie: FGD takes one drawn by the job, not the first by hostname.
    assert placement(forward[0]).nodes[0] in ("dgx-01", "dgx-02", "dgx-03")


# ---------------------------------------------------------------------- reservations


def test_a_share_never_runs_into_a_reservation_of_its_gpu() -> None:
    fleet = Shares()
    reserved = fleet.mps("node-01", [(900, 50, 0)])
    free = fleet.mps("node-02")
    fleet.reservations.append(ReservationWindow(7, "bob", (reserved.id,), NOW + 3600, NOW + 7200))
    # Ends before the window starts: best fit takes the fuller, reserved GPU.
    _, [short] = fleet.place(mps_job(1, 30, max_runtime_s=1800))
    assert placement(short).gpu_ids == (reserved.id,)
    # Would still run at its start (or has no limit): the other GPU.
    for max_runtime in (7200, None):
        _, [long] = fleet.place(mps_job(1, 30, max_runtime_s=max_runtime))
        assert placement(long).gpu_ids == (free.id,)
    waiting = fleet.pending(mps_job(2, 100), mps_job(1, 30))
    assert waiting.reason == Reason.RESERVATION
    assert waiting.message == (
        "needs an MPS share of 30 %; those free now are held by reservations it would still "
        "run into (by its maximum runtime)"
    )


def test_explanations_differ_by_what_reservations_allow_each_job() -> None:
    fleet = Shares()
    fleet.mps("node-01", [(900, 100, 0)])
    reserved = fleet.mps("node-02", [(901, 60, 0)])
    fleet.reservations.append(ReservationWindow(7, "bob", (reserved.id,), NOW + 3600, NOW + 7200))
    sharing = fleet.sharing()
    endless = sharing.explain(mps_job(1, 30), 1)
    short = sharing.explain(mps_job(2, 30, max_runtime_s=600), 2)
    assert endless.reason == Reason.RESERVATION
    assert short.reason == Reason.SHARE_UNAVAILABLE


def test_a_job_naming_its_reservation_runs_on_the_windows_gpus_only() -> None:
    fleet = Shares()
    fleet.mig("dgx-01", [("3g.20gb", 0), ("3g.20gb", 4)])
    mine = fleet.mig("dgx-02", [("3g.20gb", 0), ("3g.20gb", 4)])
    fleet.reservations.append(ReservationWindow(7, "alice", (mine.id,), NOW - 60, NOW + 7200))
    jobs = [mig_job(i, "3g.20gb", reservation=7, max_runtime_s=3600) for i in (1, 2, 3)]
    sharing, results = fleet.place(*jobs)
    assert [placement(r).gpu_ids for r in results[:2]] == [(mine.id,), (mine.id,)]
    assert results[2] is None
    # Others keep off the window's GPUs while it runs.
    _, [other] = fleet.place(mig_job(4, "3g.20gb"))
    assert placement(other).nodes == ("dgx-01",)


# ---------------------------------------------------------------------- through plan()


def test_plan_routes_shares_to_the_sharing_pass() -> None:
    fleet = Shares(pools={None: DYNAMIC})
    whole = fleet.whole("node-01")
    device = fleet.mig("dgx-01", [("3g.20gb", 0, 900), ("3g.20gb", 4)])
    idle = fleet.mig("dgx-02", [])
    shared = fleet.mps("node-02", [(901, 20, 0)])
    queue = [
        job(1),
        mig_job(2, "3g.20gb"),
        mig_job(3, "7g.40gb"),
        mps_job(4, 50),
        job(5),
        mps_job(6, 40),
    ]
    result = plan(fleet.snapshot(*queue), Fcfs())
    by_job = {p.job_id: p for p in result.placements}
    assert by_job[1].gpu_ids == (whole.id,)
    assert (by_job[2].gpu_ids, by_job[2].mig_slot) == ((device.id,), device.mig_slots[1].id)
    assert (by_job[4].gpu_ids, by_job[4].mps_percent) == ((shared.id,), 50)
    assert result.mig_creates == (
        MigCreate(3, idle.id, "7g.40gb", 0, result.mig_creates[0].explanation),
    )
    pending = {p.job_id: p for p in result.pending}
    assert pending[3].reason == Reason.MIG_RECONFIGURING
    # Whole GPUs never go to MIG-mode or MPS GPUs, and shares never exceed 100 %.
    assert pending[5].reason == Reason.RESOURCES_BUSY
    assert pending[6].reason == Reason.SHARE_UNAVAILABLE
    assert pending[6].message == (
        "needs an MPS share of 40 % of one GPU; 1 MPS GPU outside pools, the most free on one "
        "is 30 %"
    )
    assert pending[6].what_if == "with a share of 30 % it could start now"


def test_a_gpu_switched_to_another_mode_takes_nothing_until_its_work_ends() -> None:
    """A GPU's allocations are of one kind (the database's trigger refuses a mix): one whose
    MPS flag was turned off while a share runs takes no whole-GPU job, one turned MPS under a
    whole-GPU job takes no share, and a MIG-mode GPU holding a share takes no MIG job; each
    waits with a reason instead of being refused at every commit."""
    fleet = Shares()
    unshared = fleet.mps("node-01", [(900, 50, 0)], unavailable=None)  # flag off, share on
    shared = fleet.whole("node-02")
    fleet.gpus[-1] = shared = replace(shared, unavailable="mps", allocated_to=901)
    fleet._hold(901, shared.id)
    mig = fleet.mig("dgx-01", [("3g.20gb", 0)])
    fleet.gpus[-1] = mig = replace(mig, mps_jobs=(902,), mps_used_percent=30)
    assert (unshared.held_as, shared.held_as, mig.held_as) == ("mps", "gpu", "mps")
    result = plan(fleet.snapshot(job(1), mps_job(2, 10), mig_job(3, "3g.20gb")), Fcfs())
    assert result.placements == () and result.mig_creates == ()
    pending = {p.job_id: p for p in result.pending}
    assert {job_id: p.reason for job_id, p in pending.items()} == {
        1: Reason.RESOURCES_BUSY,
        2: Reason.NODES_UNAVAILABLE,  # one GPU is no longer MPS-shared
        3: Reason.RESOURCES_BUSY,
    }
    assert pending[2].message == (
        "needs an MPS share of 10 %; the MPS GPUs outside pools are unavailable (a whole-GPU "
        "job on it, no longer MPS-shared): node-01 GPU 0 and node-02 GPU 0"
    )
    assert pending[3].message.endswith("are unavailable (MPS shares on it): dgx-01 GPU 0")

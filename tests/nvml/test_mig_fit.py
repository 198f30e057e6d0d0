"""``mig_fit``: the one rule of which MIG profiles fit where, that the simulator answers by and
the MIG page shows."""

from __future__ import annotations

import dataclasses

from inventory.nvml import mig_fit
from inventory.nvml.mig_catalog import MigTable, load_table
from inventory.nvml.sim import mig as sim_mig

A100 = load_table("a100-sxm4-40gb")


def room(table: MigTable, placed: list[mig_fit.Placed]) -> dict[str, int]:
    return {p.name: mig_fit.remaining_capacity(table, placed, p) for p in table.profiles}


def test_free_placements_instance_limits_and_compute_bound_what_fits():
    # 3g.20gb (id 9) on slices 4-7: slices 0-3 and 4 compute slices are left.
    placed = [mig_fit.Placed(A100.by_name("3g.20gb").id, 4, 4)]
    assert room(A100, placed) == {
        "1g.5gb": 4,
        "1g.5gb+me": 1,
        "1g.10gb": 2,
        "2g.10gb": 2,
        "3g.20gb": 1,
        "4g.20gb": 1,
        "7g.40gb": 0,
    }
    assert mig_fit.free_starts(placed, A100.by_name("1g.10gb")) == [0, 2]


def test_compute_slices_and_the_device_limit_bound_what_fits_too():
    # A GPU with fewer compute slices or MIG devices than its placements allow.
    few_slices = dataclasses.replace(A100, compute_slices=2)
    few_devices = dataclasses.replace(A100, max_mig_devices=3)
    one_g = A100.by_name("1g.5gb")
    assert mig_fit.remaining_capacity(few_slices, [], one_g) == 2
    assert mig_fit.remaining_capacity(few_devices, [], one_g) == 3


def test_the_simulator_answers_by_the_same_rule():
    few_slices = dataclasses.replace(A100, compute_slices=2)
    one_g = A100.by_name("1g.5gb")
    gi = {"profile_id": one_g.id, "start": 0, "size": 1, "compute_instances": []}
    assert sim_mig.remaining_capacity(few_slices, [], one_g) == 2
    assert sim_mig.remaining_capacity(few_slices, [gi], one_g) == 1

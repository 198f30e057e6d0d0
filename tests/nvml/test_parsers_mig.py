"""``nvidia-smi mig -lgip/-lgipp/-lgi/-lci/-lcip`` parsers over every real MIG capture."""

import csv

import pytest

from inventory.nvml.parsers import (
    parse_mig_ci_profiles,
    parse_mig_compute_instances,
    parse_mig_gi_profiles,
    parse_mig_gpu_instances,
    parse_mig_placements,
)
from tests.nvml.captures import REAL, needs_real_captures

pytestmark = needs_real_captures
MIG = REAL / "mig"
DERIVED = REAL / "mig-profiles" / "mig_profiles__A100-40GB_A100-80GB_H100-80GB_H200.DERIVED.csv"

# -lgip captures: (GPU label in the DERIVED table, [(gpu, profile id, free, total)] in order).
LGIP = {
    "cloud-atlas__A100-40GB__mig-lgip.txt": (
        "A100-SXM4-40GB",
        [
            (0, 19, 7, 7),
            (0, 20, 1, 1),
            (0, 15, 4, 4),
            (0, 14, 3, 3),
            (0, 9, 2, 2),
            (0, 5, 1, 1),
            (0, 0, 1, 1),
        ],
    ),
    "scaleway__H100-PCIe__mig-lgip.txt": (
        "H100-PCIe-80GB",
        [
            (0, 19, 7, 7),
            (0, 20, 1, 1),
            (0, 15, 4, 4),
            (0, 14, 3, 3),
            (0, 9, 2, 2),
            (0, 5, 1, 1),
            (0, 0, 1, 1),
        ],
    ),
    "issue__NVIDIA-mig-parted-120__H200__mig-lgip.PARTIAL-a.txt": (
        "H200-SXM5-141GB",
        [(6, 19, 7, 7), (6, 20, 1, 1), (6, 15, 4, 4), (6, 14, 3, 3), (6, 9, 2, 2), (6, 5, 1, 1)],
    ),
    "issue__NVIDIA-mig-parted-120__H200__mig-lgip.PARTIAL-b.txt": (
        "H200-SXM5-141GB",
        [(2, 9, 2, 2), (2, 5, 1, 1), (2, 0, 1, 1), (3, 19, 7, 7), (3, 20, 1, 1), (3, 15, 4, 4)],
    ),
}


def _read(name: str) -> str:
    return (MIG / name).read_text()


def _derived(gpu: str) -> dict[int, dict[str, str]]:
    with DERIVED.open(newline="") as handle:
        return {int(r["profile_id"]): r for r in csv.DictReader(handle) if r["gpu"] == gpu}


def test_every_lgip_capture_is_listed() -> None:
    assert {p.name for p in MIG.glob("*mig-lgip.*txt") if "source" not in p.name} == set(LGIP)


@pytest.mark.parametrize("name", sorted(LGIP))
def test_lgip_profiles(name: str) -> None:
    gpu_label, expected = LGIP[name]
    profiles = parse_mig_gi_profiles(_read(name))
    got = [(p.gpu, p.profile_id, p.instances_free, p.instances_total) for p in profiles]
    assert got == expected
    # cross-check against the DERIVED table compiled from NVIDIA's MIG guide
    table = _derived(gpu_label)
    for profile in profiles:
        row = table[profile.profile_id]
        assert profile.name == row["profile_name"]
        assert profile.instances_total == int(row["max_instances"])
        if row["lgip_memory_gib"]:
            assert profile.memory_gib == pytest.approx(float(row["lgip_memory_gib"]))
        if row["lgip_sm"]:
            assert profile.sm == int(row["lgip_sm"])
        assert profile.p2p is False


def test_a100_lgip_two_line_rows() -> None:
    profiles = {
        p.profile_id: p
        for p in parse_mig_gi_profiles(_read("cloud-atlas__A100-40GB__mig-lgip.txt"))
    }
    assert profiles[19].name == "MIG 1g.5gb" and profiles[19].memory_gib == pytest.approx(4.75)
    me = profiles[20]
    assert me.name == "MIG 1g.5gb+me"
    assert (me.sm, me.dec, me.enc, me.ce, me.jpeg, me.ofa) == (14, 1, 0, 1, 1, 1)
    full = profiles[0]
    assert (full.sm, full.dec, full.enc, full.ce, full.jpeg, full.ofa) == (98, 5, 0, 7, 1, 1)


def test_partial_lgip_cut_after_first_line() -> None:
    last = parse_mig_gi_profiles(
        _read("issue__NVIDIA-mig-parted-120__H200__mig-lgip.PARTIAL-b.txt")
    )[-1]
    assert last.name == "MIG 1g.35gb" and last.sm == 26
    assert (last.ce, last.jpeg, last.ofa) == (None, None, None)
    full = parse_mig_gi_profiles(
        _read("issue__NVIDIA-mig-parted-120__H200__mig-lgip.PARTIAL-b.txt")
    )[2]
    assert full.name == "MIG 7g.141gb" and full.memory_gib == pytest.approx(139.75)
    assert (full.sm, full.ce, full.jpeg, full.ofa) == (132, 8, 7, 1)


def test_h100_pcie_lgipp_incl_single_placement() -> None:
    placements = parse_mig_placements(_read("scaleway__H100-PCIe__mig-lgipp.txt"))
    got = {p.profile_id: (p.starts, p.size) for p in placements}
    assert got == {
        19: ((0, 1, 2, 3, 4, 5, 6), 1),
        20: ((0, 1, 2, 3, 4, 5, 6), 1),
        15: ((0, 2, 4, 6), 2),
        14: ((0, 2, 4), 2),
        9: ((0, 4), 4),
        5: ((0,), 4),  # "Placement : {0}:4"
        0: ((0,), 8),
    }
    assert {p.gpu for p in placements} == {0}
    table = _derived("H100-PCIe-80GB")
    for p in placements:
        starts = ",".join(map(str, p.starts))
        assert table[p.profile_id]["placements_lgipp"] == f"{{{starts}}}:{p.size}"


def test_lgipp_ci_form() -> None:
    (p,) = parse_mig_placements("GPU  0 GI 1 Profile ID  0 Placements: {0,1,2}:1\n")
    assert (p.gpu, p.gpu_instance_id, p.profile_id, p.starts, p.size) == (0, 1, 0, (0, 1, 2), 1)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "cloud-atlas__A100-40GB__mig-lgi.txt",
            [("MIG 3g.20gb", 9, 1, 4, 4), ("MIG 3g.20gb", 9, 2, 0, 4)],
        ),
        (
            "scaleway__H100-PCIe__mig-lgi.txt",
            [
                ("MIG 1g.10gb", 19, 7, 0, 1),
                ("MIG 1g.10gb", 19, 8, 1, 1),
                ("MIG 1g.10gb", 19, 9, 2, 1),
                ("MIG 3g.40gb", 9, 2, 4, 4),
            ],
        ),
    ],
)
def test_lgi(name: str, expected: list[tuple[str, int, int, int, int]]) -> None:
    instances = parse_mig_gpu_instances(_read(name))
    assert [
        (i.name, i.profile_id, i.instance_id, i.placement_start, i.placement_size)
        for i in instances
    ] == expected
    assert {i.gpu for i in instances} == {0}


def test_lci() -> None:
    cis = parse_mig_compute_instances(_read("cloud-atlas__A100-40GB__mig-lci.txt"))
    assert [(c.gpu, c.gpu_instance_id, c.name, c.profile_id, c.instance_id) for c in cis] == [
        (0, 1, "MIG 1c.3g.20gb", 0, 0),
        (0, 1, "MIG 1c.3g.20gb", 0, 1),
        (0, 1, "MIG 1c.3g.20gb", 0, 2),
    ]
    assert cis[0].placement_start is None  # this driver's -lci has no Placement column


def test_lci_with_placement_column() -> None:
    row = "|   0      1       MIG 1c.3g.20gb       0         0          0:1     |\n"
    (ci,) = parse_mig_compute_instances(row)
    assert (ci.placement_start, ci.placement_size) == (0, 1)


def test_lcip() -> None:
    profiles = parse_mig_ci_profiles(_read("cloud-atlas__A100-40GB__mig-lcip.txt"))
    assert [(p.name, p.profile_id, p.is_default, p.instances_total, p.sm) for p in profiles] == [
        ("MIG 1c.3g.20gb", 0, False, 3, 14),
        ("MIG 2c.3g.20gb", 1, False, 1, 28),
        ("MIG 3g.20gb", 2, True, 1, 42),
    ]
    assert {(p.gpu_instance_id, p.ce, p.jpeg) for p in profiles} == {(1, 3, 0)}


def test_other_mig_files_hold_no_listing_rows() -> None:
    # creation messages, -L and the default table are not -lgip/-lgi/-lci output
    for name in (
        "scaleway__H100-PCIe__mig-cgi-9-19-19-19-C.txt",
        "nvidia_gpu_exporter__H100-80GB-HBM3__nvidia-smi-table-mig.txt",
    ):
        text = _read(name)
        assert parse_mig_gi_profiles(text) == []
        assert parse_mig_gpu_instances(text) == []
        assert parse_mig_compute_instances(text) == []


def test_mig_guide_examples() -> None:
    guide = (REAL / "mig-profiles" / "nvidia-mig-user-guide-v580__scrape.md").read_text()
    assert len(parse_mig_placements(guide)) == 7
    instances = parse_mig_gpu_instances(guide)
    assert instances[0].name == "MIG 3g.20gb" and instances[0].placement_start == 4

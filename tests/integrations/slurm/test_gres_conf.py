"""``gpuadmin slurm gres-conf``: the gres.conf text of catalogued nodes, discovered from the
simulator's machine models (slurmd's reading of it: test_gres_conf_slurmd.py)."""

from __future__ import annotations

import pytest

from gpuadmin import cli
from integrations.slurm.gres import (
    CatalogGpu,
    node_gres_conf,
    render,
    slurm_cores,
    slurm_gpu_type,
    threads_per_core,
)
from tests.scheduling.conftest import add_sim_node

DGX_A100 = """\
# gres.conf for dgx-01, from gpuadmin's catalog (gpuadmin slurm gres-conf).
# Its line in slurm.conf: NodeName=dgx-01 Gres=gpu:a100:8 ...
# GPUs in PCI bus ID order, Slurm's device order.
# Cores= are Slurm's core indexes (lstopo's Core L#) of each GPU's CPU affinity, each core's 2
#   threads counted once.
# Links= are the NVLinks to each GPU in this order; -1 is the GPU itself.
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia0 Cores=48-63 Links=-1,12,12,12,12,12,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia1 Cores=48-63 Links=12,-1,12,12,12,12,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia2 Cores=16-31 Links=12,12,-1,12,12,12,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia3 Cores=16-31 Links=12,12,12,-1,12,12,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia4 Cores=112-127 Links=12,12,12,12,-1,12,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia5 Cores=112-127 Links=12,12,12,12,12,-1,12,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia6 Cores=80-95 Links=12,12,12,12,12,12,-1,12
NodeName=dgx-01 Name=gpu Type=a100 File=/dev/nvidia7 Cores=80-95 Links=12,12,12,12,12,12,12,-1
"""


def gres_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.django_db
def test_a_dgx_a100_behind_nvswitch_has_12_links_between_every_pair():
    assert node_gres_conf(add_sim_node("dgx-01", "dgx-a100-80gb")) == DGX_A100


@pytest.mark.django_db
def test_a_dgx_1_lists_its_hybrid_cube_mesh():
    text = node_gres_conf(add_sim_node("dgx1-01", "dgx-1-v100"))
    # NV1 and NV2 of `nvidia-smi topo -m`; 0 where two GPUs are SYS apart (GPU 0 and GPU 5).
    assert gres_lines(text) == [
        f"NodeName=dgx1-01 Name=gpu Type=v100 File=/dev/nvidia{minor} Cores={cores} Links={links}"
        for minor, cores, links in [
            (0, "0-19", "-1,1,1,2,2,0,0,0"),
            (1, "0-19", "1,-1,2,1,0,2,0,0"),
            (2, "0-19", "1,2,-1,2,0,0,1,0"),
            (3, "0-19", "2,1,2,-1,0,0,0,1"),
            (4, "20-39", "2,0,0,0,-1,1,1,2"),
            (5, "20-39", "0,2,0,0,1,-1,2,1"),
            (6, "20-39", "0,0,1,0,1,2,-1,2"),
            (7, "20-39", "0,0,0,1,2,1,2,-1"),
        ]
    ]
    assert "Gres=gpu:v100:8 " in text


@pytest.mark.django_db
def test_a_pcie_box_without_nvlink_groups_its_gpus_by_numa_node():
    text = node_gres_conf(add_sim_node("l40s-01", "pcie-l40s-4x"))
    assert gres_lines(text) == [
        "NodeName=l40s-01 Name=gpu Type=l40s File=/dev/nvidia[0-1] Cores=0-31",
        "NodeName=l40s-01 Name=gpu Type=l40s File=/dev/nvidia[2-3] Cores=32-63",
    ]
    assert "Links=" not in text


@pytest.mark.django_db
def test_gpus_in_mig_mode_are_left_out_with_a_comment():
    # The dgx-a100-40gb model's GPUs 0 and 1 are in MIG mode.
    text = node_gres_conf(add_sim_node("mig-01", "dgx-a100-40gb"))
    assert gres_lines(text) == [
        f"NodeName=mig-01 Name=gpu Type=a100 File=/dev/nvidia{minor} Cores={cores} Links={links}"
        for minor, cores, links in [
            (2, "16-31", "-1,12,12,12,12,12"),
            (3, "16-31", "12,-1,12,12,12,12"),
            (4, "112-127", "12,12,-1,12,12,12"),
            (5, "112-127", "12,12,12,-1,12,12"),
            (6, "80-95", "12,12,12,12,-1,12"),
            (7, "80-95", "12,12,12,12,12,-1"),
        ]
    ]
    comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert "Gres=gpu:a100:6 " in comment
    assert (
        "Left out, in MIG mode: /dev/nvidia0, GPU 0 (00000000:07:00.0); /dev/nvidia1, GPU 1 "
        "(00000000:0F:00.0). Slurm 22.05 gives MIG devices to jobs as MultipleFiles="
    ) in comment


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("Tesla V100-PCIE-16GB", "v100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4080 SUPER", "rtx_4080_super"),
        ("NVIDIA RTX A6000", "rtx_a6000"),
        ("Quadro RTX 8000", "rtx_8000"),
    ],
)
def test_the_type_is_the_model_in_lower_case_as_in_gres_gpu_a100_2(name, kind):
    assert slurm_gpu_type(name) == kind
    # What NVML detection would call it contains it, as gres.conf(5) asks of a Type=.
    assert kind in name.casefold().replace(" ", "_")


def cpus(*ranges: range) -> set[int]:
    return {cpu for span in ranges for cpu in span}


def test_cores_count_each_cores_threads_once():
    # A DGX A100: 2 x 64 cores, CPU c and c + 128 are one core's threads.
    numa3 = cpus(range(48, 64), range(176, 192))
    assert threads_per_core(256, [numa3, cpus(range(16, 32), range(144, 160))]) == 2
    assert slurm_cores(numa3, 256, 2) == tuple(range(48, 64))


def test_without_smt_cpus_are_cores():
    # Two sockets of 32 cores, no second threads: nothing 32 apart pairs up.
    assert threads_per_core(64, [cpus(range(0, 32)), cpus(range(32, 64))]) == 1
    assert slurm_cores(cpus(range(32, 64)), 64, 1) == tuple(range(32, 64))


def gpu(pk: int, affinity: str) -> CatalogGpu:
    return CatalogGpu(
        pk=pk,
        index=pk,
        minor_number=pk,
        name="NVIDIA L40S",
        pci_bus_id=f"00000000:{pk + 1:02X}:00.0",
        cpu_affinity=affinity,
        mig_enabled=False,
    )


def test_cores_are_left_out_when_every_cpu_is_near_or_the_cpus_are_unknown():
    near_all = render("box", 16, [gpu(0, "0-15"), gpu(1, "")], {})
    assert gres_lines(near_all) == ["NodeName=box Name=gpu Type=l40s File=/dev/nvidia[0-1]"]
    unknown = render("box", None, [gpu(0, "0-7"), gpu(1, "8-15")], {})
    assert "Cores= left out: the node's CPU count is not known." in unknown
    assert gres_lines(unknown) == ["NodeName=box Name=gpu Type=l40s File=/dev/nvidia[0-1]"]


def test_links_are_written_when_any_gpu_has_an_nvlink():
    # A bridged pair (NV4) beside a GPU without NVLink: one line each, every line with Links=.
    text = render("box", 16, [gpu(0, "0-7"), gpu(1, "0-7"), gpu(2, "8-15")], {(0, 1): 4})
    assert gres_lines(text) == [
        "NodeName=box Name=gpu Type=l40s File=/dev/nvidia0 Cores=0-7 Links=-1,4,0",
        "NodeName=box Name=gpu Type=l40s File=/dev/nvidia1 Cores=0-7 Links=4,-1,0",
        "NodeName=box Name=gpu Type=l40s File=/dev/nvidia2 Cores=8-15 Links=0,0,-1",
    ]


@pytest.mark.django_db
def test_the_verb_prints_the_file_and_refuses_an_unknown_node(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)  # pytest-django set it up
    add_sim_node("dgx-01", "dgx-a100-80gb")
    assert cli.main(["slurm", "gres-conf", "dgx-01"]) == 0
    assert capsys.readouterr().out == DGX_A100
    assert cli.main(["slurm", "gres-conf", "dgx-z9"]) == 1
    assert capsys.readouterr().err == "gpuadmin slurm gres-conf: no node 'dgx-z9' in the catalog\n"

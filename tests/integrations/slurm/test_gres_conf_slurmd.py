"""Debian's slurmd (22.05, built without NVML) reads the gres.conf ``gpuadmin slurm gres-conf``
writes for catalogued nodes: ``slurmd -G`` prints the GPUs it parsed, on device files made for
the test (links to /dev/null: slurmd wants character devices) and the node's CPUs as
slurm.conf declares them (``SlurmdParameters=config_overrides``: not this machine's)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from integrations.slurm.gres import node_gres_conf
from tests.scheduling.conftest import add_sim_node
from tests.tools import debian_program

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# Each machine model's CPUs as slurm.conf describes them: sockets, cores a socket, threads a core.
MACHINES = {
    "dgx-a100-80gb": (2, 64, 2),
    "dgx-a100-40gb": (2, 64, 2),  # GPUs 0 and 1 in MIG mode
    "dgx-1-v100": (2, 20, 2),
    "pcie-l40s-4x": (2, 32, 2),
}
# slurmd -G's line for each GPU it parsed.
PARSED = re.compile(
    r"Gres Name=gpu Type=(?P<type>\S+) Count=(?P<count>\d+) Index=(?P<index>\d+) ID=\d+ "
    r"File=(?P<file>\S+) Cores=(?P<cores>\S+) CoreCnt=\d+ (?:Links=(?P<links>\S+)|\(null\))"
)
# gres.conf's fields of a line, by name.
FIELD = re.compile(r"(\w+)=(\S+)")


def slurmd_binary() -> str:
    return debian_program("slurmd", "install-slurm")


def slurmd_reads(text: str, hostname: str, model: str, folder: Path) -> str:
    """``slurmd -G``'s output for ``text`` as the gres.conf of node ``hostname``, its device
    files moved under ``folder``."""
    sockets, cores, threads = MACHINES[model]
    gres = re.search(r"Gres=(\S+)", text)
    assert gres is not None, text
    (folder / "dev").mkdir()
    for minor in range(8):
        (folder / "dev" / f"nvidia{minor}").symlink_to("/dev/null")
    (folder / "gres.conf").write_text(text.replace("File=/dev/", f"File={folder}/dev/"))
    conf = folder / "slurm.conf"
    conf.write_text(
        f"""ClusterName=gres-test
SlurmctldHost=localhost
AuthType=auth/munge
StateSaveLocation={folder}
SlurmdSpoolDir={folder}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName={hostname} CPUs={sockets * cores * threads} Boards=1 SocketsPerBoard={sockets} \
CoresPerSocket={cores} ThreadsPerCore={threads} RealMemory=1000 Gres={gres[1]}
PartitionName=batch Nodes={hostname} Default=YES
"""
    )
    done = subprocess.run(
        [slurmd_binary(), "-G", "-N", hostname, "-f", str(conf)],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize("model", MACHINES)
def test_slurmd_reads_every_gpu_as_written(model, tmp_path):
    hostname = f"{model}-01"
    text = node_gres_conf(add_sim_node(hostname, model))
    output = slurmd_reads(text, hostname, model, tmp_path)
    assert "error" not in output.casefold(), output
    parsed = [match.groupdict() for match in PARSED.finditer(output)]
    written = [dict(FIELD.findall(line)) for line in text.splitlines() if not line.startswith("#")]
    assert len(parsed) == len(written), output
    for line, gpus in zip(written, parsed, strict=True):
        assert gpus["type"] == line["Type"]
        assert gpus["file"] == line["File"].replace("/dev/", f"{tmp_path}/dev/")
        assert gpus["cores"] == line["Cores"]
        assert gpus["links"] == line.get("Links")
        minors = line["File"].removeprefix("/dev/nvidia")
        if minors.startswith("["):  # a group of two (the PCIe box's GPUs of a NUMA node)
            assert (gpus["count"], gpus["links"]) == ("2", None)
        else:  # one GPU, known by its minor number, as Slurm's GPU indexes are
            assert (gpus["count"], gpus["index"]) == ("1", minors)

"""The simulated nodes' ``nvidia-smi`` (``inventory.nvml.smi``): what it prints, line by line
against the real captures (``../shared/fixtures/real/``), and read back by the project's own
parsers of real output."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inventory.nvml import smi
from inventory.nvml.parsers.listing import parse_gpu_list
from inventory.nvml.parsers.query_csv import parse_query_csv
from inventory.nvml.parsers.smi_text import parse_smi_text
from inventory.nvml.parsers.smi_xml import parse_smi_xml
from inventory.nvml.parsers.topo import parse_topo_matrix
from inventory.nvml.scanner import scan
from inventory.nvml.sim import SimulatedNvml, faults
from tests.nvml.captures import REAL, needs_real_captures

NOW = 1_700_000_000.0
H100_BUNDLE = (
    "capture-bundles/nvidia_gpu_exporter__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
)


def sim(model: str = "dgx-h100", mig: dict[str, list[str]] | None = None) -> SimulatedNvml:
    node = {"name": "node-01", "model": model, "mig": mig or {}}
    backend = SimulatedNvml.from_fleet_spec([node], "node-01")
    backend.nvmlInit()
    return backend


def run(backend: SimulatedNvml, *argv: str, visible: str | None = None) -> str:
    return smi.run(backend, argv, visible, NOW)


def uuids_scrubbed(text: str) -> str:
    """UUIDs as the captures scrub them (zeros), numbered as there."""
    counter: dict[str, int] = {}

    def zero(match: re.Match[str]) -> str:
        kind = match[1]
        number = counter.setdefault(kind, 0)
        counter[kind] += 1
        return f"{kind}-{number:08x}-0000-0000-0000-{number:012x}"

    return re.sub(
        r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", zero, text
    )


def shape(value: str) -> str:
    """A value with its identifiers and numbers blanked: ``81559 MiB`` -> ``N MiB``."""
    value = re.sub(r"(GPU|MIG)-[0-9a-f-]{36}", r"\1-UUID", value)
    value = re.sub(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", "BUS", value)
    value = re.sub(r"\b[0-9A-F]{2}(\.[0-9A-F]{2}){4}\b", "VBIOS", value)
    return re.sub(r"\d+(\.\d+)?", "N", value)


@needs_real_captures
def test_list_matches_the_h100_mig_capture_line_by_line() -> None:
    backend = sim(mig={"0": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]})
    real = (REAL / "mig/nvidia_gpu_exporter__H100-80GB-HBM3__nvidia-smi-L-mig.txt").read_text()
    ours = uuids_scrubbed(run(backend, "-L", "-i", "0"))
    assert ours.splitlines() == real.splitlines()


def bars(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c in "|+"]


@needs_real_captures
def test_the_table_lines_up_with_the_h100_capture() -> None:
    """A bare ``nvidia-smi`` against the H100 capture under load: every line as long, its
    columns where the capture has them, the fixed lines and every value's shape the same."""
    bundle = (REAL / H100_BUNDLE).read_text()
    real = bundle.split("# load :: nvidia-smi (default table)\n# $ nvidia-smi \n")[1]
    real_lines = real.split("#" * 80 + "\n")[1].rstrip("\n").split("\n")
    backend = sim()
    faults.start_process(backend, None, 0, 11327, used_mib=2566, name="/root/tools/memhog")
    ours = run(backend, "-i", "0").rstrip("\n").split("\n")
    assert len(ours) == len(real_lines) - 2  # the capture has three processes, this one
    pairs = list(zip(ours[:19], real_lines[:19], strict=True)) + [(ours[19], real_lines[21])]
    for mine, theirs in pairs:
        assert (len(mine), bars(mine)) == (len(theirs), bars(theirs)), (mine, theirs)
        if mine is ours[0]:  # the time
            continue
        assert shape(mine).split() == shape(theirs).split(), (mine, theirs)
    assert ours[8].startswith("|   0  NVIDIA H100 80GB HBM3          On  |")
    assert ours[18] == real_lines[18]  # the process, as the capture shows it
    assert run(sim("dgx-a100-40gb"), "-i", "2").split("\n")[-3] == (
        "|  No running processes found" + " " * 61 + "|"
    )


def test_list_reads_back_as_the_scan_has_it() -> None:
    backend = sim("dgx-a100-40gb")
    listed = parse_gpu_list(run(backend, "-L"))
    scanned = scan(backend, include=("facts", "metrics"))
    assert [(g.index, g.name, g.uuid) for g in listed] == [
        (g.facts.index, g.facts.name, g.facts.uuid) for g in scanned.gpus
    ]
    assert [[(d.profile, d.uuid) for d in g.mig_devices] for g in listed] == [
        [(f"MIG {d.profile}", d.uuid) for d in (g.metrics.mig_devices if g.metrics else ())]
        for g in scanned.gpus
    ]


@needs_real_captures
def test_query_gpu_prints_the_captures_header_and_value_shapes() -> None:
    """Every field the simulated nvidia-smi knows, against the H100's all-fields capture (the
    header cell exactly, the value's shape), with and without units."""
    header, row = (
        (REAL / "query-csv/nvidia_gpu_exporter__H100-80GB-HBM3__query-gpu-all-fields-load.csv")
        .read_text()
        .splitlines()[:2]
    )
    real = dict(zip(header.split(", "), row.split(", "), strict=True))
    names = {cell.split(" [")[0]: cell for cell in real}
    fields = [name for name in smi.QUERY_FIELDS if name in names]
    assert len(fields) >= 25
    backend = sim()
    ours = run(backend, f"--query-gpu={','.join(fields)}", "--format=csv").splitlines()
    assert ours[0] == ", ".join(names[name] for name in fields)
    for line in ours[1:]:
        values = line.split(", ")
        for name, value in zip(fields, values, strict=True):
            expected = real[names[name]]
            if name in ("name", "driver_version", "compute_cap"):
                continue  # the model's own (a DGX H100's driver is not the VM's)
            if expected.startswith("[") or value.startswith("["):
                continue  # N/A on one of the two
            assert shape(value) == shape(expected), name
    bare = run(backend, "--query-gpu=memory.total,power.draw", "--format=csv,noheader,nounits")
    assert re.fullmatch(r"(\d+, \d+\.\d\d\n){8}", bare)


@needs_real_captures
def test_query_gpu_matches_the_smaller_captures() -> None:
    a10 = (REAL / "query-csv/xuesongtap__A10__query-gpu-lms.csv").read_text().splitlines()
    fields = [cell.split(" [")[0] for cell in a10[0].split(", ")]
    ours = run(sim("pcie-l40s-4x"), f"--query-gpu={','.join(fields)}", "--format=csv")
    lines = ours.splitlines()
    assert lines[0] == a10[0]
    assert {shape(line) for line in lines[1:]} == {shape(a10[1])}
    h100 = REAL / "query-csv/stas00-ml-engineering__8xH100__query-gpu-name-busid-vbios.csv"
    real = h100.read_text().splitlines()
    lines = run(sim(), "--query-gpu=name,pci.bus_id,vbios_version", "--format=csv").splitlines()
    assert lines[0] == real[0]
    assert [shape(line) for line in lines[1:]] == [shape(real[1])] * 8
    assert lines[1].startswith("NVIDIA H100 80GB HBM3, 00000000:")
    parsed = parse_query_csv(run(sim(), "--query-gpu=name,memory.total", "--format=csv"))
    assert parsed[0] == {"name": "NVIDIA H100 80GB HBM3", "memory.total": 81559}


def test_bad_queries_are_refused_as_nvidia_smi_does() -> None:
    with pytest.raises(smi.UsageError, match='Field "bogus" is not a valid field to query.'):
        run(sim(), "--query-gpu=name,bogus", "--format=csv")
    with pytest.raises(smi.UsageError, match="--format=csv"):
        run(sim(), "--query-gpu=name")


@needs_real_captures
def test_topo_matrix_prints_nvidia_smis_legend_and_reads_back() -> None:
    backend = sim("dgx-a100-40gb")
    ours = run(backend, "topo", "-m")
    bundle = (REAL / H100_BUNDLE).read_text()
    legend = bundle[bundle.index("Legend:") :].split("\n\n\n")[0] + "\n"
    assert legend in ours
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    real_header = ansi.sub("", bundle.split("# $ nvidia-smi topo -m\n")[1].split("\n")[1])
    assert ours.splitlines()[0].endswith(real_header.removeprefix("\tGPU0"))  # its columns
    matrix = parse_topo_matrix(ours)
    scanned = scan(backend, include=("topology",)).topology
    assert matrix.names[:8] == tuple(f"GPU{i}" for i in range(8))
    assert matrix.nvlink_count("GPU0", "GPU1") == 12
    assert scanned is not None and scanned.gpus == tuple(range(8))


def test_q_and_q_x_read_back_with_the_parsers_of_real_output() -> None:
    backend = sim("dgx-a100-40gb")
    scanned = scan(backend, include=("facts", "metrics", "mig"))
    for log in (parse_smi_xml(run(backend, "-q", "-x")), parse_smi_text(run(backend, "-q"))):
        assert (log.driver_version, log.cuda_version, log.attached_gpus) == (
            "535.129.03",
            "12.2",
            8,
        )
        assert [
            (g.pci_bus_id, g.product_name, g.uuid, g.serial, g.fb_memory.total_mib, g.mig_current)
            for g in log.gpus
        ] == [
            (
                f.pci_bus_id,
                f.name,
                f.uuid,
                f.serial,
                f.memory_total_mib,
                f.mig_enabled,
            )
            for f in (g.facts for g in scanned.gpus)
        ]
        assert [len(g.mig_devices) for g in log.gpus] == [3, 7, 0, 0, 0, 0, 0, 0]


@needs_real_captures
def test_q_text_lines_up_as_the_real_one() -> None:
    """Every ``label : value`` line has its colon where the real capture has it."""
    real = REAL / "nvidia-smi-q-text/xuesongtap__A100-SXM4-40GB__nvidia-smi-i0-q_535.129.03.txt"
    columns = {line.index(" : ") for line in real.read_text().splitlines() if " : " in line}
    ours = run(sim("dgx-a100-40gb"), "-q")
    assert {line.index(" : ") for line in ours.splitlines() if " : " in line} == columns
    assert ours.startswith("\n==============NVSMI LOG==============\n\nTimestamp ")


def test_a_confined_job_sees_its_own_devices_only() -> None:
    backend = sim("dgx-a100-40gb")
    scanned = scan(backend, include=("facts", "metrics"))
    whole = scanned.gpus[3].facts.uuid
    metrics = scanned.gpus[0].metrics
    assert metrics is not None
    device = metrics.mig_devices[1]
    listed = parse_gpu_list(run(backend, "-L", visible=f"{whole},{device.uuid}"))
    assert [(g.index, [d.uuid for d in g.mig_devices]) for g in listed] == [
        (0, [device.uuid]),
        (3, []),
    ]
    csv = run(backend, "--query-gpu=index,uuid", "--format=csv,noheader", visible=whole)
    assert csv == f"3, {whole}\n"
    topo = run(backend, "topo", "-m", visible=f"{whole},{device.uuid}").splitlines()
    assert topo[0].split("\t")[1:3] == ["GPU0", "GPU3"]
    assert [line.split("\t")[0] for line in topo[1:3]] == ["GPU0", "GPU3"]
    with pytest.raises(smi.NoDevices, match="No devices were found"):
        run(backend, "-L", visible="")  # confined to no GPU


def test_the_shim_runs_the_simulator_of_its_node(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    agent = SimulatedNvml.from_model("dgx-a100-80gb", node_name="n1", state_dir=str(state))
    agent.nvmlInit()
    shim = smi.write_shim(
        tmp_path / "bin",
        python=sys.executable,
        node="n1",
        state_dir=str(state),
        sim_model="dgx-a100-80gb",
    )
    out = subprocess.run(
        [str(shim), "--query-gpu=index,name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
        timeout=60,
    )
    assert out.stdout.splitlines() == [f"{i}, NVIDIA A100-SXM4-80GB" for i in range(8)]
    refused = subprocess.run(
        [str(shim), "--query-gpu=nope", "--format=csv"], capture_output=True, text=True, timeout=60
    )
    assert (refused.returncode, refused.stderr) == (
        2,
        'Field "nope" is not a valid field to query.\n',
    )
    assert time.time() > NOW

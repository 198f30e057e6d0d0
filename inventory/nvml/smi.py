"""``nvidia-smi`` for the jobs of a simulated node, answering from its simulator: ``-L``,
``-q`` (``-x``: XML), ``--query-gpu=... --format=csv[,noheader][,nounits]``, ``topo -m``,
``-i``; printed as the real tool prints them (``../shared/fixtures/real/``).

A simulated agent writes a shim named ``nvidia-smi`` (``write_shim``) that runs
``python -m inventory.nvml.smi`` with its node's simulator, and puts it on its jobs' ``PATH``.
A confined job sees only its own devices (``VISIBLE_ENV``, set by the executor), as NVML shows
only the devices a job's cgroup allows; otherwise every GPU of the node. Plain Python.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shlex
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from inventory.nvml import open_backend
from inventory.nvml.parsers.common import normalize_bus_id
from inventory.nvml.scanner import GpuScan, NodeScan, scan

# The simulator the shim opens (set by the shim only, for this process).
SIM_MODEL_ENV = "GPUADMIN_SMI_SIM_MODEL"
SIM_FLEET_ENV = "GPUADMIN_SMI_SIM_FLEET"
NODE_ENV = "GPUADMIN_SMI_NODE"
STATE_DIR_ENV = "GPUADMIN_SMI_STATE_DIR"
# A confined job's GPU and MIG device UUIDs, comma-separated (unset: the job sees every GPU).
VISIBLE_ENV = "GPUADMIN_SIM_VISIBLE_DEVICES"

NA = "[N/A]"
LABEL_WIDTH = 42  # -q text: labels (with their indent) are padded to this column
TOPO_LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""  # noqa: E501 - nvidia-smi's own lines


@dataclass(frozen=True)
class View:
    """What a job sees: the node's scan, its GPUs narrowed to the visible ones."""

    node: NodeScan
    gpus: tuple[GpuScan, ...]
    topo: str
    now: float
    process_names: dict[int, str] = dataclasses.field(default_factory=dict)


def _visible(node: NodeScan, visible: str | None) -> tuple[GpuScan, ...]:
    """The GPUs a job sees: all of them, or (confined) those it holds or holds a MIG device
    of, each of the latter with only its held MIG devices."""
    if visible is None:
        return node.gpus
    wanted = {uuid.strip() for uuid in visible.split(",") if uuid.strip()}
    seen = []
    for gpu in node.gpus:
        if gpu.facts.uuid in wanted:
            seen.append(gpu)
            continue
        devices = tuple(
            d for d in (gpu.metrics.mig_devices if gpu.metrics else ()) if d.uuid in wanted
        )
        if devices and gpu.metrics is not None:
            seen.append(_with_mig_devices(gpu, devices))
    return tuple(seen)


def _with_mig_devices(gpu: GpuScan, devices: tuple[Any, ...]) -> GpuScan:
    assert gpu.metrics is not None
    return dataclasses.replace(gpu, metrics=dataclasses.replace(gpu.metrics, mig_devices=devices))


# --------------------------------------------------------------------------- -L


def gpu_list(view: View) -> str:
    """``nvidia-smi -L``: a line per GPU, its MIG devices indented under it."""
    lines = []
    for gpu in view.gpus:
        facts = gpu.facts
        lines.append(f"GPU {facts.index}: {facts.name} (UUID: {facts.uuid})")
        for number, device in enumerate(gpu.metrics.mig_devices if gpu.metrics else ()):
            lines.append(f"  MIG {device.profile:<11} Device {number:>2}: (UUID: {device.uuid})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- --query-gpu


def _timestamp(now: float) -> str:
    return (
        time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    )


def _metric(gpu: GpuScan, name: str) -> Any:
    """One of the GPU's live metrics (None without them)."""
    return None if gpu.metrics is None else getattr(gpu.metrics, name)


def _enabled(value: bool | None) -> str | None:
    return None if value is None else ("Enabled" if value else "Disabled")


def _watts(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"


# name -> (header unit or "", value of (view, gpu)); nvidia-smi --help-query-gpu's names.
Field = tuple[str, Callable[[View, GpuScan], Any]]
QUERY_FIELDS: dict[str, Field] = {
    "timestamp": ("", lambda v, g: _timestamp(v.now)),
    "driver_version": ("", lambda v, g: v.node.system.driver_version),
    "count": ("", lambda v, g: len(v.gpus)),
    "name": ("", lambda v, g: g.facts.name),
    "serial": ("", lambda v, g: g.facts.serial),
    "uuid": ("", lambda v, g: g.facts.uuid),
    "index": ("", lambda v, g: g.facts.index),
    "pci.bus_id": ("", lambda v, g: g.facts.pci_bus_id),
    "pci.device_id": ("", lambda v, g: g.facts.pci_device_id),
    "vbios_version": ("", lambda v, g: g.facts.vbios_version),
    "persistence_mode": ("", lambda v, g: g.facts.persistence_mode),
    "compute_mode": ("", lambda v, g: g.facts.compute_mode),
    "compute_cap": ("", lambda v, g: g.facts.compute_capability),
    "pstate": ("", lambda v, g: _metric(g, "pstate")),
    "fan.speed": ("%", lambda v, g: _metric(g, "fan_pct")),
    "memory.total": ("MiB", lambda v, g: g.facts.memory_total_mib),
    "memory.used": ("MiB", lambda v, g: g.facts.memory_used_mib),
    "memory.free": ("MiB", lambda v, g: g.facts.memory_free_mib),
    "utilization.gpu": ("%", lambda v, g: _metric(g, "utilization_gpu_pct")),
    "utilization.memory": ("%", lambda v, g: _metric(g, "utilization_memory_pct")),
    "temperature.gpu": ("", lambda v, g: _metric(g, "temperature_c")),
    "temperature.memory": ("", lambda v, g: _metric(g, "memory_temperature_c")),
    "power.draw": ("W", lambda v, g: _watts(_metric(g, "power_w"))),
    "power.limit": ("W", lambda v, g: _watts(g.facts.power_limit_enforced_w)),
    "enforced.power.limit": ("W", lambda v, g: _watts(g.facts.power_limit_enforced_w)),
    "power.default_limit": ("W", lambda v, g: _watts(g.facts.power_limit_default_w)),
    "clocks.current.sm": ("MHz", lambda v, g: _metric(g, "sm_clock_mhz")),
    "clocks.current.memory": ("MHz", lambda v, g: _metric(g, "mem_clock_mhz")),
    "clocks.max.sm": ("MHz", lambda v, g: g.facts.max_sm_clock_mhz),
    "clocks.max.memory": ("MHz", lambda v, g: g.facts.max_mem_clock_mhz),
    "mig.mode.current": ("", lambda v, g: _enabled(g.facts.mig_enabled)),
    "mig.mode.pending": ("", lambda v, g: _enabled(g.facts.mig_pending_enabled)),
    "ecc.mode.current": ("", lambda v, g: _enabled(g.facts.ecc_enabled)),
}
# Names nvidia-smi takes for the same properties.
QUERY_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.memory": "clocks.current.memory",
}


class Refusal(Exception):
    """What nvidia-smi says instead of an answer (on stderr), and its exit status."""

    status = 1


class UsageError(Refusal):
    """A command line nvidia-smi refuses."""

    status = 2


class NoDevices(Refusal):
    """No GPU to show (a job confined to none, an ``-i`` of none)."""

    status = 6


NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)


def query_gpu(view: View, fields: Sequence[str], options: Sequence[str]) -> str:
    """``--query-gpu=FIELDS --format=csv[,noheader][,nounits]``."""
    if "csv" not in options:
        raise UsageError('"--format=csv" is required with --query-gpu.')
    columns = []
    for name in fields:
        key = QUERY_ALIASES.get(name, name)
        if key not in QUERY_FIELDS:
            raise UsageError(f'Field "{name}" is not a valid field to query.')
        columns.append((name, *QUERY_FIELDS[key]))
    units = "nounits" not in options
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(f"{n} [{u}]" if u and units else n for n, u, _ in columns))
    for gpu in view.gpus:
        cells = []
        for _, unit, value_of in columns:
            value = value_of(view, gpu)
            if value is None:
                cells.append(NA)
            else:
                cells.append(f"{value} {unit}" if unit and units else str(value))
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- topo -m


_GPU_NAME = re.compile(r"GPU\d+")


def topo_matrix(view: View) -> str:
    """``nvidia-smi topo -m``: the simulator's matrix (of the visible GPUs, and the NICs),
    with nvidia-smi's legend."""
    matrix, _, nic_legend = view.topo.partition("\n\nNIC Legend:")
    rows = [line.split("\t") for line in matrix.rstrip("\n").split("\n")]
    shown = {f"GPU{gpu.facts.index}" for gpu in view.gpus}
    header = rows[0]
    keep = [i for i, name in enumerate(header) if not _GPU_NAME.fullmatch(name) or name in shown]
    lines = []
    for row in rows:
        if _GPU_NAME.fullmatch(row[0]) and row[0] not in shown:
            continue
        lines.append("\t".join(row[i] for i in keep if i < len(row)))
    text = "\n".join(lines) + "\n\n" + TOPO_LEGEND
    if nic_legend:
        text += "\nNIC Legend:" + nic_legend
    return text


# --------------------------------------------------------------------------- the table

_RULE = "+" + "-" * 89 + "+"
_GPU_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
_TABLE_HEAD = """\
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|"""
_PROCESSES_HEAD = """\
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|"""


def _or_na(value: object, unit: str = "") -> str:
    return "N/A" if value is None else f"{value}{unit}"


def summary(view: View) -> str:
    """A bare ``nvidia-smi``: the GPU table and the processes, as drivers since 520 draw
    them."""
    system = view.node.system
    stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(view.now))
    driver, cuda = _or_na(system.driver_version), _or_na(system.cuda_driver_version)
    lines = [
        f"{stamp}       ",
        _RULE,
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
        _GPU_RULE,
        _TABLE_HEAD,
    ]
    processes = []
    for gpu in view.gpus:
        facts, metrics, health = gpu.facts, gpu.metrics, gpu.health
        power = None if metrics is None or metrics.power_w is None else round(metrics.power_w)
        cap = facts.power_limit_enforced_w
        if facts.mig_enabled:
            ecc = "On"
        elif facts.ecc_enabled:
            ecc = _or_na(health and health.ecc_volatile_uncorrected)
        else:
            ecc = "N/A" if facts.ecc_enabled is None else "Off"
        persistence = {"Enabled": "On", "Disabled": "Off"}.get(facts.persistence_mode or "", "N/A")
        mig = _enabled(facts.mig_enabled) if gpu.mig is not None else None
        fan, temp = _or_na(_metric(gpu, "fan_pct"), "%"), _or_na(_metric(gpu, "temperature_c"), "C")
        perf, usage = _or_na(_metric(gpu, "pstate")), _or_na(power, "W")
        limit = _or_na(None if cap is None else round(cap), "W")
        used, total = _or_na(facts.memory_used_mib, "MiB"), _or_na(facts.memory_total_mib, "MiB")
        util, mode = _or_na(_metric(gpu, "utilization_gpu_pct"), "%"), _or_na(facts.compute_mode)
        lines += [
            f"| {facts.index:>3}  {(facts.name or ''):<29}{persistence:>4}  "
            f"| {(facts.pci_bus_id or ''):>18} Off | {ecc:>20} |",
            f"| {fan:>3}{temp:>6}{perf:>6}{usage:>16} / {limit:>5} "
            f"| {used:>10} / {total:>9} | {util:>7}{mode:>13} |",
            f"|{'':41}|{'':24}| {_or_na(mig):>20} |",
            _GPU_RULE,
        ]
        processes += [(facts.index, p) for p in (metrics.processes if metrics else ())]
    lines += ["", _RULE, _PROCESSES_HEAD]
    for index, process in processes:
        name = view.process_names.get(process.pid, "")
        name = name if len(name) <= 37 else "..." + name[-34:]
        lines.append(
            f"|{index:>5}{_or_na(process.gpu_instance_id):>6}{_or_na(process.compute_instance_id):>5}"
            f"{process.pid:>16}{process.kind:>7}   {name:<37}"
            f"{_or_na(process.used_memory_mib, 'MiB'):>9} |"
        )
    if not processes:
        lines.append(f"|{'  No running processes found':<89}|")
    lines.append(_RULE)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- -q and -q -x

# A -q section: (text label, XML tag, value or sub-sections); None values print N/A.
Entry = tuple[str, str, "str | list[Entry] | None"]


def _unit(value: object, unit: str) -> str | None:
    return None if value is None else f"{value} {unit}"


def _gpu_entries(gpu: GpuScan) -> list[Entry]:
    facts, metrics = gpu.facts, gpu.metrics
    mig = gpu.mig
    mig_devices: list[Entry] = [
        (
            "MIG Device",
            "mig_device",
            [
                ("Index", "index", str(number)),
                ("GPU Instance ID", "gpu_instance_id", str(device.gi_id)),
                ("Compute Instance ID", "compute_instance_id", str(device.ci_id)),
                (
                    "FB Memory Usage",
                    "fb_memory_usage",
                    [
                        ("Total", "total", _unit(device.memory_total_mib, "MiB")),
                        ("Used", "used", _unit(device.memory_used_mib, "MiB")),
                    ],
                ),
            ],
        )
        for number, device in enumerate(metrics.mig_devices if metrics else ())
    ]
    processes: list[Entry] = [
        (
            "Process ID",
            "process_info",
            [
                ("GPU instance ID", "gpu_instance_id", _number(p.gpu_instance_id)),
                ("Compute instance ID", "compute_instance_id", _number(p.compute_instance_id)),
                ("Process ID", "pid", str(p.pid)),
                ("Type", "type", p.kind),
                ("Used GPU Memory", "used_memory", _unit(p.used_memory_mib, "MiB")),
            ],
        )
        for p in (metrics.processes if metrics else ())
    ]
    m: Any = metrics
    return [
        ("Product Name", "product_name", facts.name),
        ("Product Brand", "product_brand", "NVIDIA"),
        ("Product Architecture", "product_architecture", facts.architecture),
        ("Persistence Mode", "persistence_mode", facts.persistence_mode),
        (
            "MIG Mode",
            "mig_mode",
            [
                ("Current", "current_mig", _enabled(facts.mig_enabled) if mig else None),
                ("Pending", "pending_mig", _enabled(facts.mig_pending_enabled) if mig else None),
            ],
        ),
        ("MIG Devices", "mig_devices", mig_devices or "None"),
        ("Serial Number", "serial", facts.serial),
        ("GPU UUID", "uuid", facts.uuid),
        ("Minor Number", "minor_number", _number(facts.minor_number)),
        ("VBIOS Version", "vbios_version", facts.vbios_version),
        ("Board Part Number", "board_part_number", facts.board_part_number),
        (
            "PCI",
            "pci",
            [
                ("Device Id", "pci_device_id", facts.pci_device_id),
                ("Bus Id", "pci_bus_id", facts.pci_bus_id),
            ],
        ),
        ("Fan Speed", "fan_speed", _unit(m and m.fan_pct, "%")),
        ("Performance State", "performance_state", m and m.pstate),
        (
            "FB Memory Usage",
            "fb_memory_usage",
            [
                ("Total", "total", _unit(facts.memory_total_mib, "MiB")),
                ("Used", "used", _unit(facts.memory_used_mib, "MiB")),
                ("Free", "free", _unit(facts.memory_free_mib, "MiB")),
            ],
        ),
        ("Compute Mode", "compute_mode", facts.compute_mode),
        (
            "Utilization",
            "utilization",
            [
                ("Gpu", "gpu_util", _unit(m and m.utilization_gpu_pct, "%")),
                ("Memory", "memory_util", _unit(m and m.utilization_memory_pct, "%")),
            ],
        ),
        (
            "Temperature",
            "temperature",
            [
                ("GPU Current Temp", "gpu_temp", _unit(m and m.temperature_c, "C")),
                ("Memory Current Temp", "memory_temp", _unit(m and m.memory_temperature_c, "C")),
            ],
        ),
        (
            "GPU Power Readings",
            "gpu_power_readings",
            [
                ("Power Draw", "power_draw", _unit(_watts(m and m.power_w), "W")),
                (
                    "Current Power Limit",
                    "current_power_limit",
                    _unit(_watts(facts.power_limit_enforced_w), "W"),
                ),
                (
                    "Default Power Limit",
                    "default_power_limit",
                    _unit(_watts(facts.power_limit_default_w), "W"),
                ),
            ],
        ),
        (
            "Clocks",
            "clocks",
            [
                ("SM", "sm_clock", _unit(m and m.sm_clock_mhz, "MHz")),
                ("Memory", "mem_clock", _unit(m and m.mem_clock_mhz, "MHz")),
            ],
        ),
        (
            "Max Clocks",
            "max_clocks",
            [
                ("SM", "sm_clock", _unit(facts.max_sm_clock_mhz, "MHz")),
                ("Memory", "mem_clock", _unit(facts.max_mem_clock_mhz, "MHz")),
            ],
        ),
        ("Processes", "processes", processes or "None"),
    ]


def _number(value: int | None) -> str | None:
    return None if value is None else str(value)


def _header(view: View) -> list[tuple[str, str, str | None]]:
    system = view.node.system
    cuda = system.cuda_driver_version
    return [
        ("Timestamp", "timestamp", time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(view.now))),
        ("Driver Version", "driver_version", system.driver_version),
        ("CUDA Version", "cuda_version", cuda),
        ("Attached GPUs", "attached_gpus", str(len(view.gpus))),
    ]


def query_text(view: View) -> str:
    """``nvidia-smi -q``."""
    lines = ["", "==============NVSMI LOG==============", ""]
    head = _header(view)
    for label, _, value in head[:3]:
        lines.append(_text_line(label, value, 0))
    lines.append("")
    lines.append(_text_line(*head[3][::2], 0))
    for gpu in view.gpus:
        lines.append(f"GPU {gpu.facts.pci_bus_id}")
        lines += _text_entries(_gpu_entries(gpu), 1)
        lines.append("")
    return "\n".join(lines) + "\n"


def _text_line(label: str, value: str | None, depth: int) -> str:
    return f"{'    ' * depth + label:<{LABEL_WIDTH}}: {'N/A' if value is None else value}"


def _text_entries(entries: list[Entry], depth: int) -> list[str]:
    lines = []
    for label, _, value in entries:
        if isinstance(value, list):
            lines.append("    " * depth + label)
            lines += _text_entries(value, depth + 1)
        else:
            lines.append(_text_line(label, value, depth))
    return lines


def query_xml(view: View) -> str:
    """``nvidia-smi -q -x``."""
    root = ET.Element("nvidia_smi_log")
    for _, tag, value in _header(view):
        ET.SubElement(root, tag).text = "N/A" if value is None else value
    for gpu in view.gpus:
        element = ET.SubElement(root, "gpu", id=gpu.facts.pci_bus_id or "")
        _xml_entries(element, _gpu_entries(gpu))
    ET.indent(root, space="\t")
    body = ET.tostring(root, encoding="unicode")
    return (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        + body
        + "\n"
    )


def _xml_entries(parent: ET.Element, entries: list[Entry]) -> None:
    for _, tag, value in entries:
        child = ET.SubElement(parent, tag)
        if isinstance(value, list):
            _xml_entries(child, value)
        else:
            child.text = "N/A" if value is None else value


# --------------------------------------------------------------------------- the command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvidia-smi",
        description="nvidia-smi of a simulated gpuadmin node (answers from its simulator)",
    )
    parser.add_argument("-L", "--list-gpus", action="store_true")
    parser.add_argument("-q", "--query", action="store_true")
    parser.add_argument("-x", "--xml-format", action="store_true")
    parser.add_argument("-i", "--id", help="GPU index, UUID or PCI bus id (comma-separated)")
    parser.add_argument("--query-gpu", metavar="FIELDS")
    parser.add_argument("--format", metavar="csv[,noheader][,nounits]", default="")
    return parser


def _select(gpus: tuple[GpuScan, ...], ids: str | None) -> tuple[GpuScan, ...]:
    if ids is None:
        return gpus
    chosen = []
    for wanted in ids.split(","):
        bus_id = normalize_bus_id(wanted) if ":" in wanted else None
        found = [
            g
            for g in gpus
            if wanted in (str(g.facts.index), g.facts.uuid)
            or (bus_id is not None and g.facts.pci_bus_id == bus_id)
        ]
        if not found:
            raise NoDevices("No devices were found")
        chosen += found
    return tuple(chosen)


def run(backend: Any, argv: Sequence[str], visible: str | None, now: float) -> str:
    """What ``nvidia-smi ARGV`` prints on ``backend``'s machine for a job that sees ``visible``
    (None: every GPU). ``Refusal`` (its message and exit status) where it prints none."""
    argv = list(argv)
    topo = argv[:1] == ["topo"]
    if topo and argv[1:] not in (["-m"], ["--matrix"]):
        raise UsageError("topo: only -m (--matrix) is simulated")
    args = _parser().parse_args([] if topo else argv)
    node = scan(backend, include=("facts", "metrics", "mig", "health"))
    gpus = _select(_visible(node, visible), args.id)
    names = {}
    for process in (p for gpu in gpus if gpu.metrics for p in gpu.metrics.processes):
        with contextlib.suppress(pynvml.NVMLError):
            names[process.pid] = backend.nvmlSystemGetProcessName(process.pid)
    if not gpus:
        raise NoDevices("No devices were found")
    view = View(node, gpus, backend.topo_matrix_text() if topo else "", now, names)
    if topo:
        return topo_matrix(view)
    if args.list_gpus:
        return gpu_list(view)
    if args.query_gpu:
        return query_gpu(view, args.query_gpu.split(","), args.format.split(","))
    if args.query:
        return query_xml(view) if args.xml_format else query_text(view)
    return summary(view)


def main(argv: Sequence[str] | None = None) -> int:
    """The shim's entry point: the simulator from the shim's environment."""
    env = os.environ
    backend = open_backend(
        "sim",
        sim_model=env.get(SIM_MODEL_ENV) or None,
        sim_fleet=env.get(SIM_FLEET_ENV) or None,
        node_name=env.get(NODE_ENV) or None,
        state_dir=env.get(STATE_DIR_ENV) or None,
    )
    try:
        backend.nvmlInit()
    except pynvml.NVMLError:
        sys.stderr.write(NO_DRIVER + "\n")
        return 9
    try:
        output = run(
            backend, sys.argv[1:] if argv is None else argv, env.get(VISIBLE_ENV), time.time()
        )
    except Refusal as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.status
    sys.stdout.write(output)
    return 0


def write_shim(
    directory: Path,
    *,
    python: str,
    node: str,
    state_dir: str,
    sim_model: str | None = None,
    sim_fleet: str | None = None,
) -> Path:
    """``DIRECTORY/nvidia-smi``: a shell script that runs this module with ``python`` on the
    simulator of ``node`` (the same machine model or fleet spec, and state directory, as its
    agent's). Put ``directory`` first on a job's ``PATH``."""
    code_root = str(Path(__file__).resolve().parents[2])  # the directory holding inventory/
    settings = {
        SIM_MODEL_ENV: sim_model or "",
        SIM_FLEET_ENV: sim_fleet or "",
        NODE_ENV: node,
        STATE_DIR_ENV: state_dir,
        "PYTHONPATH": code_root,
    }
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in settings.items())
    script = (
        "#!/bin/sh\n"
        "# nvidia-smi of a simulated gpuadmin node, written by its agent "
        "(python -m inventory.nvml.smi).\n"
        f'exec env {assignments} {shlex.quote(python)} -m inventory.nvml.smi "$@"\n'
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    partial = path.with_suffix(".tmp")
    partial.write_text(script)
    partial.chmod(0o755)
    partial.replace(path)
    return path


if __name__ == "__main__":
    sys.exit(main())

"""A node's ``gres.conf`` from the catalog (``gpuadmin slurm gres-conf NODE``), since Debian's
slurmd, built without NVML, cannot detect GPUs (``AutoDetect=nvml``) and must read each one.

One ``Name=gpu`` line per GPU in PCI bus ID order (Slurm's device order, which ``Links=``
follows), grouped when identical and without ``Links=``; ``Type=`` the model's short name,
``File=`` its minor number, ``Cores=`` Slurm's core indexes (not the catalog's CPU ids),
``Links=`` the ``NV#`` of ``nvidia-smi topo -m``. GPUs in MIG mode are left out with a comment.
Why each field is what it is: docs/administration/slurm-gres.md.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from inventory.models import Gpu, GpuLink, Node
from inventory.nvml.parsers.common import format_cpu_list, parse_cpu_list

# Words of an NVIDIA model name that are not the model: the brand, the form factor, the
# memory ("NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-16GB", "NVIDIA H100 80GB HBM3").
_BRANDS = {"nvidia", "tesla", "geforce", "quadro"}
_VARIANT = re.compile(r"sxm\d*|pcie|hbm\d*e?|nvl|\d+gb", re.IGNORECASE)
COMMENT_WIDTH = 100
# Hardware threads per core tried, widest first (x86 servers have 1 or 2).
_SMT_WIDTHS = (4, 2)


def slurm_gpu_type(name: str) -> str:
    """Slurm's ``Type=`` for a GPU model: ``NVIDIA A100-SXM4-80GB`` -> ``a100``, ``NVIDIA H100
    80GB HBM3`` -> ``h100``, ``NVIDIA GeForce RTX 4080 SUPER`` -> ``rtx_4080_super``."""
    words = [word for word in re.split(r"[\s-]+", name.strip()) if word]
    while words and words[0].casefold() in _BRANDS:
        words.pop(0)
    model: list[str] = []
    for word in words:
        if _VARIANT.fullmatch(word):
            break
        model.append(word.casefold())
    return "_".join(model) or "_".join(name.casefold().split())


def threads_per_core(cpu_count: int, affinities: Iterable[Collection[int]]) -> int:
    """How many hardware threads each core has, as the GPUs' CPU affinities show it: Linux
    numbers a core's first thread ``c`` (0 to cores - 1, socket after socket) and its other
    threads ``c + cores``, ``c + 2 * cores``..., so with T threads per core an affinity holds,
    with each CPU, the CPUs ``cpu_count / T`` apart from it. The widest such T, else 1."""
    partial = [set(cpus) for cpus in affinities if cpus and len(set(cpus)) < cpu_count]
    for width in _SMT_WIDTHS:
        if not partial or cpu_count % width:
            continue
        cores = cpu_count // width
        if all((cpu + cores) % cpu_count in cpus for cpus in partial for cpu in cpus):
            return width
    return 1


def slurm_cores(cpus: Collection[int], cpu_count: int, threads: int) -> tuple[int, ...]:
    """Slurm's core indexes of a CPU affinity (``threads_per_core``' numbering): each CPU's
    core, ``cpu mod cores``."""
    cores = cpu_count // threads
    return tuple(sorted({cpu % cores for cpu in cpus}))


@dataclass(frozen=True)
class CatalogGpu:
    """What ``gres.conf`` says of a GPU, as the catalog holds it."""

    pk: int
    index: int
    minor_number: int | None
    name: str
    pci_bus_id: str
    cpu_affinity: str  # Linux cpulist; "" when unknown
    mig_enabled: bool


@dataclass(frozen=True)
class _Line:
    minors: tuple[int, ...]
    type: str
    cores: str
    links: str


def node_gres_conf(node: Node) -> str:
    """The ``gres.conf`` of ``node``'s present GPUs (``render``)."""
    gpus = [
        CatalogGpu(
            pk=gpu.pk,
            index=gpu.index,
            minor_number=gpu.minor_number,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            cpu_affinity=gpu.cpu_affinity,
            mig_enabled=gpu.mig_enabled,
        )
        for gpu in Gpu.objects.present().filter(node=node)
    ]
    nvlinks = {
        (link.gpu_a_id, link.gpu_b_id): link.nvlink_count
        for link in GpuLink.objects.filter(node=node, link_type__startswith="NV")
    }
    return render(node.hostname, node.cpu_count, gpus, nvlinks)


def render(
    hostname: str,
    cpu_count: int | None,
    gpus: Sequence[CatalogGpu],
    nvlinks: Mapping[tuple[int, int], int],
) -> str:
    """The ``gres.conf`` text of a node with ``cpu_count`` logical CPUs (None: unknown) and
    ``gpus``, ``nvlinks`` giving the NVLinks between two GPUs by their pks (lower first)."""
    ordered = sorted(gpus, key=lambda gpu: gpu.pci_bus_id)
    notes: list[str] = []
    listed: list[CatalogGpu] = []
    in_mig: list[str] = []
    for gpu in ordered:
        where = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        if gpu.minor_number is None:
            notes.append(f"{where} left out: its device minor number is not known.")
        elif gpu.mig_enabled:
            in_mig.append(f"/dev/nvidia{gpu.minor_number}, {where}")
        else:
            listed.append(gpu)
    if in_mig:
        notes.append(
            f"Left out, in MIG mode: {'; '.join(in_mig)}. Slurm 22.05 gives MIG devices to jobs "
            "as MultipleFiles= records of the GPU and its /dev/nvidia-caps files, which slurmd "
            "builds only with AutoDetect=nvml."
        )
    if not listed:
        return _comment([f"gres.conf for {hostname}: no GPU to list.", *notes])

    affinities = {gpu.pk: parse_cpu_list(gpu.cpu_affinity or None) or () for gpu in listed}
    threads = 1
    if cpu_count is None:
        notes.append("Cores= left out: the node's CPU count is not known.")
    else:
        threads = threads_per_core(cpu_count, affinities.values())

    def cores(gpu: CatalogGpu) -> str:
        cpus = affinities[gpu.pk]
        if cpu_count is None or not cpus or len(cpus) >= cpu_count or max(cpus) >= cpu_count:
            return ""  # unknown, near every core, or not this node's CPUs
        return format_cpu_list(slurm_cores(cpus, cpu_count, threads))

    def links(gpu: CatalogGpu) -> tuple[int, ...]:
        return tuple(
            -1 if other is gpu else nvlinks.get((min(gpu.pk, other.pk), max(gpu.pk, other.pk)), 0)
            for other in listed
        )

    with_links = any(count > 0 for gpu in listed for count in links(gpu))
    lines: list[_Line] = []
    for gpu in listed:
        assert gpu.minor_number is not None  # the others are left out above
        line = _Line(
            minors=(gpu.minor_number,),
            type=slurm_gpu_type(gpu.name),
            cores=cores(gpu),
            links=",".join(map(str, links(gpu))) if with_links else "",
        )
        if lines and _joins(lines[-1], line):
            lines[-1] = _Line(lines[-1].minors + line.minors, line.type, line.cores, "")
        else:
            lines.append(line)

    counts: dict[str, int] = {}
    for line in lines:
        counts[line.type] = counts.get(line.type, 0) + len(line.minors)
    gres = ",".join(f"gpu:{kind}:{count}" for kind, count in counts.items())
    header = [
        f"gres.conf for {hostname}, from gpuadmin's catalog (gpuadmin slurm gres-conf).",
        f"Its line in slurm.conf: NodeName={hostname} Gres={gres} ...",
        "GPUs in PCI bus ID order, Slurm's device order.",
    ]
    if any(line.cores for line in lines):
        threads_note = f", each core's {threads} threads counted once" if threads > 1 else ""
        header.append(
            f"Cores= are Slurm's core indexes (lstopo's Core L#) of each GPU's CPU affinity"
            f"{threads_note}."
        )
    if with_links:
        header.append("Links= are the NVLinks to each GPU in this order; -1 is the GPU itself.")
    return _comment(header + notes) + "".join(_format(hostname, line) for line in lines)


def _joins(previous: _Line, line: _Line) -> bool:
    """One line may hold both: neither has Links=, they agree, and the minor numbers ascend
    (Slurm expands ``/dev/nvidia[0-1]`` in ascending order)."""
    return (
        not previous.links
        and not line.links
        and (previous.type, previous.cores) == (line.type, line.cores)
        and line.minors[0] > previous.minors[-1]
    )


def _format(hostname: str, line: _Line) -> str:
    if len(line.minors) == 1:
        device = f"/dev/nvidia{line.minors[0]}"
    else:
        device = f"/dev/nvidia[{format_cpu_list(line.minors)}]"
    fields = [f"NodeName={hostname}", "Name=gpu", f"Type={line.type}", f"File={device}"]
    if line.cores:
        fields.append(f"Cores={line.cores}")
    if line.links:
        fields.append(f"Links={line.links}")
    return " ".join(fields) + "\n"


def _comment(paragraphs: Iterable[str]) -> str:
    """Comment lines of at most ``COMMENT_WIDTH`` characters."""
    return "".join(
        f"# {line}\n"
        for paragraph in paragraphs
        for line in textwrap.wrap(paragraph, COMMENT_WIDTH - 2, subsequent_indent="  ")
    )

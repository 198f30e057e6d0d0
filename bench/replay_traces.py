"""Public GPU-cluster traces as replay workloads (bench/replay.py).

Each loader reads the unmodified files under ``../shared/traces`` (see its INDEX.md) and
returns a `Workload`: the fleet (nodes and their GPUs), the jobs (submission, true duration,
GPUs, project) and what the trace's publishers measured on it, where they did.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tarfile
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from random import Random
from types import MappingProxyType

TRACES_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"

# Helios' replay of Philly (SC'21, QSSF): the Oct-Nov 2017 window.
PHILLY_WINDOW = ("2017-10-01", "2017-12-01")
PHILLY_NODE_GPUS = 8
ITP_NODE_GPUS = 8
# Pollux's simulated cluster: 16 nodes with 4 GPUs each.
POLLUX_NODES, POLLUX_NODE_GPUS = 16, 4
POLLUX_LOADS = {
    "0.5": "workloads-0.5",
    "1.0": "workloads",
    "1.5": "workloads-1.5",
    "2.0": "workloads-2.0",
}


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `share_milli` below 1,000 asks for that share of one GPU (an MPS
    share); `estimate` is what its user declared (None in the traces as read; see
    `with_helios_estimates`); `cpus` and `memory_mib` the host CPUs and memory it asks for
    on each node (0: none; openb only, whose CPUs are millicores, as its nodes' are)."""

    id: int
    submit: float
    duration: float
    gpus: int
    project: str
    name: str = ""
    share_milli: int = 1000
    estimate: float | None = None
    cpus: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node; `cpus` and `memory_mib` are what jobs may use of its host (None: unknown)."""

    hostname: str
    gpus: int
    model: str
    cpus: int | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class Partition:
    """GPUs no other partition's jobs use (a Philly virtual cluster), simulated alone."""

    name: str
    nodes: tuple[NodeSpec, ...]
    jobs: tuple[TraceJob, ...]
    mps: bool = False  # every GPU is shared by MPS; every job is a share of one GPU

    @property
    def gpu_count(self) -> int:
        return sum(node.gpus for node in self.nodes)


@dataclass(frozen=True)
class Workload:
    """A replay: its partitions, each project's entitlement (GPUs), notes on how the trace
    was read, and the publishers' figures (name -> value) where there are any. `fill`: jobs
    never end (the FGD experiment: arrivals until the fleet is full)."""

    name: str
    partitions: tuple[Partition, ...]
    entitled: Mapping[str, float]
    notes: tuple[str, ...] = ()
    published: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    fill: bool = False

    @property
    def jobs(self) -> int:
        return sum(len(partition.jobs) for partition in self.partitions)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _nodes(prefix: str, count: int, gpus: int, model: str) -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(f"{prefix}-{number:04d}", gpus, model) for number in range(count))


def _limited(rows: list[TraceJob], limit: int | None) -> tuple[TraceJob, ...]:
    return tuple(rows if limit is None else rows[:limit])


def philly(
    traces: Path = TRACES_DIR,
    window: tuple[str, str] = PHILLY_WINDOW,
    limit: int | None = None,
    *,
    shared: bool = False,
    capacity: float = 1.0,
) -> Workload:
    """Philly 2017 (via the Sia artifact; the file is not sorted), jobs submitted in
    `window`, on the 11 virtual clusters Helios replays (its philly_vc.csv: nodes x 8 GPUs,
    2,816 GPUs). By default each VC is its own partition, as in Helios' simulator; `shared`
    puts them all in one fleet where each VC is a project entitled to its size (a quota the
    engine lets others borrow up to). `capacity` scales every VC (never below its largest
    job): at full size the window keeps Helios' 2,816 GPUs lightly busy."""
    vc_nodes: dict[str, int] = {}
    with (traces / "helios_artifact_small" / "philly_vc.csv").open() as file:
        for row in csv.DictReader(file):
            vc_nodes[row["vc"]] = int(row["node num"])
    start, end = _epoch(window[0]), _epoch(window[1])
    with (traces / "philly_via_sia" / "philly.csv").open() as file:
        rows = [
            row
            for row in csv.DictReader(file)
            if start <= _epoch(row["timestamp"]) < end and float(row["duration"]) > 0
        ]
    rows.sort(key=lambda row: (row["timestamp"], row["cluster"], float(row["duration"])))
    outside = sum(row["cluster"] not in vc_nodes for row in rows)
    jobs = [
        TraceJob(
            id=number,
            submit=_epoch(row["timestamp"]),
            duration=float(row["duration"]),
            gpus=int(row["num_gpus"]),
            project=row["cluster"],
        )
        for number, row in enumerate((row for row in rows if row["cluster"] in vc_nodes), 1)
    ]
    selected = _limited(jobs, limit)
    for vc, nodes in vc_nodes.items():
        largest = max((job.gpus for job in selected if job.project == vc), default=1)
        vc_nodes[vc] = max(math.ceil(nodes * capacity), math.ceil(largest / PHILLY_NODE_GPUS))
    entitled = {vc: nodes * PHILLY_NODE_GPUS for vc, nodes in vc_nodes.items()}
    notes = (
        f"window {window[0]}..{window[1]} (UTC): {len(selected)} jobs; {outside} jobs of VCs "
        "Helios does not size left out",
        f"VC sizes x {capacity:g}: {sum(entitled.values()):,} GPUs",
        "VCs as " + ("projects of one shared fleet" if shared else "partitions (as Helios)"),
    )
    partitions: tuple[Partition, ...]
    if shared:
        fleet = _nodes("philly", sum(vc_nodes.values()), PHILLY_NODE_GPUS, "philly")
        partitions = (Partition("philly", fleet, selected),)
    else:
        by_vc: dict[str, list[TraceJob]] = defaultdict(list)
        for job in selected:
            by_vc[job.project].append(job)
        partitions = tuple(
            Partition(vc, _nodes(vc, count, PHILLY_NODE_GPUS, "philly"), tuple(by_vc[vc]))
            for vc, count in vc_nodes.items()
        )
    return Workload("philly", partitions, MappingProxyType(entitled), notes)


def itp(
    nodes: int, traces: Path = TRACES_DIR, cluster: str = "cluster04", limit: int | None = None
) -> Workload:
    """One Microsoft ITP 2021 cluster (ElasticFlow's raw trace) on `nodes` DGX nodes."""
    with tarfile.open(traces / "microsoft_itp_elasticflow" / "raw-traces.tar.gz") as archive:
        member = archive.extractfile(f"{cluster}.csv")
        assert member is not None, f"{cluster}.csv is missing from the archive"
        rows = list(csv.DictReader(io.TextIOWrapper(member)))
    rows.sort(key=lambda row: (int(row["submission_time"]), row["job_id"]))
    jobs = [
        TraceJob(
            id=number,
            submit=float(row["submission_time"]),
            duration=float(row["duration"]),
            gpus=int(row["num_gpu"]),
            project=cluster,
            name=row["job_id"],
        )
        for number, row in enumerate(rows, 1)
        if int(row["duration"]) > 0
    ]
    fleet = _nodes(f"itp{nodes}", nodes, ITP_NODE_GPUS, "dgx")
    return Workload(
        f"itp-{cluster}-{nodes}n",
        (Partition(cluster, fleet, _limited(jobs, limit)),),
        MappingProxyType({cluster: float(nodes * ITP_NODE_GPUS)}),
        (f"{cluster}: {len(jobs)} jobs, {nodes} nodes x {ITP_NODE_GPUS} GPUs",),
    )


def _pollux_rows(traces: Path, load: str, number: int) -> list[dict[str, str]]:
    path = traces / "pollux_osdi21" / POLLUX_LOADS[load] / f"workload-{number}.csv"
    with path.open() as file:
        return list(csv.DictReader(file))


def _pollux_summary(traces: Path, policy: str, load: str) -> dict[str, object]:
    path = traces / "pollux_osdi21" / "results-jobload" / f"{policy}-{load}" / "summary.json"
    summary: dict[str, object] = json.loads(path.read_text())
    return summary


def pollux_run_times(traces: Path = TRACES_DIR) -> dict[tuple[str, int, int], float]:
    """Pollux's workloads name each job's application, GPUs and batch size but no duration.
    Per (application, GPUs, batch size): the shortest JCT Tiresias (fixed GPUs, as
    submitted) reached for such a job in Pollux's published results over all loads and
    workloads, i.e. its run time when it never waited."""
    shortest: dict[tuple[str, int, int], float] = {}
    for load in POLLUX_LOADS:
        jcts = _pollux_summary(traces, "tiresias", load)["jcts"]
        assert isinstance(jcts, dict)
        for number in range(1, 9):
            for row in _pollux_rows(traces, load, number):
                key = (row["application"], int(row["num_replicas"]), int(row["batch_size"]))
                jct = float(jcts[f"workload-{number}"][row["name"]])
                shortest[key] = min(jct, shortest.get(key, jct))
    return shortest


def pollux(
    number: int, traces: Path = TRACES_DIR, load: str = "1.0", limit: int | None = None
) -> Workload:
    """Pollux OSDI'21 workload `number` (160 jobs over 8 hours) on 16 nodes x 4 GPUs, with
    Pollux's published average JCTs for it (Pollux, Optimus, Tiresias at this load)."""
    run_times = pollux_run_times(traces)
    jobs = [
        TraceJob(
            id=index,
            submit=float(row["time"]),
            duration=run_times[
                (row["application"], int(row["num_replicas"]), int(row["batch_size"]))
            ],
            gpus=int(row["num_replicas"]),
            project=row["application"],
            name=row["name"],
        )
        for index, row in enumerate(_pollux_rows(traces, load, number), 1)
    ]
    jobs.sort(key=lambda job: (job.submit, job.id))
    published = {}
    for policy in ("pollux", "optimus", "tiresias"):
        averages = _pollux_summary(traces, policy, load)["avgs"]
        assert isinstance(averages, dict)
        published[policy] = float(averages[f"workload-{number}"])
    fleet = _nodes("pollux", POLLUX_NODES, POLLUX_NODE_GPUS, "t4")
    return Workload(
        f"pollux-{number}",
        (Partition(f"workload-{number}", fleet, _limited(jobs, limit)),),
        MappingProxyType({"pollux": float(POLLUX_NODES * POLLUX_NODE_GPUS)}),
        (
            "run time per (application, GPUs, batch size): the shortest JCT of Tiresias in "
            "Pollux's published results",
        ),
        MappingProxyType(published),
    )


def openb(
    traces: Path = TRACES_DIR,
    pods: str = "default",
    limit: int | None = None,
    inflate: float = 1.3,
) -> Workload:
    """Alibaba GPU 2023 (FGD, ATC'23): the GPU pods of openb_pod_list_<pods>.csv on the
    1,213 GPU nodes, in creation order and never leaving: FGD's fill experiment, where what
    the full fleet can no longer use is the fragmentation. The pod list is repeated (fresh
    ids, later times) until the pods ask for `inflate` times the fleet's GPUs, so that the
    fleet does fill up.

    Every GPU is shared by MPS and a pod takes a share of one GPU: gpu_milli in whole
    percents (rounded up), 100 % for a whole-GPU pod. Pods asking for several GPUs have no
    such form (a share is one GPU) and are left out. Each pod also asks for its node's CPUs
    (cpu_milli, rounded up to whole CPUs) and memory, out of the node's (cpu_milli rounded
    down, memory_mib)."""
    folder = traces / "alibaba_gpu_v2023_openb"
    with (folder / "openb_node_list_gpu_node.csv").open() as file:
        fleet = tuple(
            NodeSpec(
                row["sn"],
                int(row["gpu"]),
                row["model"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
            )
            for row in csv.DictReader(file)
        )
    with (folder / f"openb_pod_list_{pods}.csv").open() as file:
        rows = [row for row in csv.DictReader(file) if int(row["num_gpu"]) > 0]
    rows.sort(key=lambda row: (int(row["creation_time"]), row["name"]))
    several = [row for row in rows if int(row["num_gpu"]) > 1]
    rows = [row for row in rows if int(row["num_gpu"]) == 1]
    gpus = sum(node.gpus for node in fleet)
    span = int(rows[-1]["creation_time"]) + 1
    jobs: list[TraceJob] = []
    asked, rounds = 0.0, 0
    while asked < inflate * gpus and (limit is None or len(jobs) < limit):
        for row in rows:
            milli = 10 * math.ceil(int(row["gpu_milli"]) / 10)
            jobs.append(
                TraceJob(
                    id=len(jobs) + 1,
                    submit=float(int(row["creation_time"]) + rounds * span),
                    duration=math.inf,
                    gpus=1,
                    project=row["qos"],
                    name=row["name"],
                    share_milli=milli,
                    cpus=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                )
            )
            asked += milli / 1000
            if asked >= inflate * gpus:
                break
        rounds += 1
    selected = _limited(jobs, limit)
    return Workload(
        f"openb-{pods}",
        (Partition("openb", fleet, selected, mps=True),),
        MappingProxyType({"openb": float(gpus)}),
        (
            f"{len(selected)} one-GPU pods (the list {rounds} times over) asking for "
            f"{sum(job.share_milli for job in selected) / 1000:,.0f} of {gpus:,} GPUs; "
            f"{len(several)} pods asking for several GPUs left out; pods never leave; pods ask "
            f"for {sum(job.cpus for job in selected) / 1000:,.0f} of "
            f"{sum(n.cpus or 0 for n in fleet) / 1000:,.0f} CPUs",
        ),
        fill=True,
    )


# How far Helios' runtime estimates were off (SC'21; its artifact gives Philly's jobs, which
# name no user and no job, their true durations off by this distribution instead of a
# predictor's): (share of jobs at most, relative error from, to), cumulative.
HELIOS_ESTIMATE_ERRORS = (
    (0.1, 0.0, 0.1),
    (0.5, 0.1, 0.5),
    (0.7, 0.5, 1.0),
    (0.9, 1.0, 10.0),
    (1.0, 10.0, 100.0),
)


def with_helios_estimates(workload: Workload, seed: int) -> Workload:
    """`workload` with each job's declared estimate its true duration off by Helios' error
    distribution (over or under at even odds; at least a second): the information the
    published Philly QSSF figures had."""
    rng = Random(seed)

    def estimate(duration: float) -> float:
        level = rng.random()
        low, high = next((lo, hi) for share, lo, hi in HELIOS_ESTIMATE_ERRORS if level <= share)
        error = rng.uniform(low, high) * rng.choice((-1, 1))
        return max(1.0, duration * (1 + error))

    partitions = tuple(
        replace(p, jobs=tuple(replace(job, estimate=estimate(job.duration)) for job in p.jobs))
        for p in workload.partitions
    )
    return replace(workload, partitions=partitions)


def shape(gpus: int, node_gpus: int) -> tuple[int, int]:
    """(GPUs per node, nodes) for a job of `gpus` on nodes of `node_gpus`: one node when it
    fits, else the fewest nodes that split it evenly (12 GPUs on 8-GPU nodes: 2 x 6)."""
    for nodes in range(1, gpus + 1):
        if gpus % nodes == 0 and gpus // nodes <= node_gpus:
            return gpus // nodes, nodes
    raise ValueError(f"{gpus} GPUs cannot be split over nodes of {node_gpus}")

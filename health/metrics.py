"""What ``/metrics`` says about the GPUs: dcgm-exporter's series, and gpuadmin's health series.

The DCGM series carry dcgm-exporter's names, HELP texts and labels (``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``; ``GPU_I_PROFILE`` and ``GPU_I_ID`` on a MIG GPU,
one series per GPU instance as dcgm-exporter repeats them), so that DCGM Grafana dashboards
work unchanged. They are read from the latest live samples (``inventory.live``, one Redis
round trip for the whole fleet); a value the GPU does not report is left out, never 0 (an
A100 in MIG mode has no utilization).

dcgm-exporter's counters keep their names but are exposed untyped: prometheus-client writes
every counter's samples as ``<name>_total``, which would rename the series dashboards query.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any, ClassVar, NamedTuple

from django.db.models import Count
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpuadmin.metrics import UnknownNode
from health.choices import AlertState, EventKind, Severity
from health.models import Alert, HealthEvent
from inventory import live
from inventory.choices import GpuState
from inventory.live import LiveSample, MigDeviceSample
from inventory.models import Gpu, Node
from inventory.nvml.scanner import throttle_reason_mask
from inventory.querysets import heartbeat_cutoff

# A MIG GPU instance as the live sample lists it (one entry per compute instance).
Instance = MigDeviceSample | None

MISSING = "missing"  # not a stored state: the GPU's node no longer reports it


@dataclass(frozen=True)
class DcgmField:
    """One dcgm-exporter series: its name and HELP (as default-counters.csv words them), and
    how to read it from a GPU's live sample (and, for memory, its MIG instance)."""

    name: str
    documentation: str
    read: Callable[[LiveSample, Instance], Any]
    counter: bool = False  # a counter in dcgm-exporter (exposed untyped: see the module doc)


@dataclass(frozen=True)
class key:  # noqa: N801 - reads as the function it stands for
    """The sample's own field ``name`` (the same for every MIG instance of the GPU); the text
    writer reads ``name`` itself, without a call per sample."""

    name: str

    def __call__(self, sample: LiveSample, instance: Instance) -> Any:
        return sample.get(self.name)


def memory_used(sample: LiveSample, instance: Instance) -> Any:
    return (instance or sample).get("memory_used_mib")


def memory_free(sample: LiveSample, instance: Instance) -> Any:
    where = instance or sample
    used, total = where.get("memory_used_mib"), where.get("memory_total_mib")
    return None if used is None or total is None else total - used


def pstate(sample: LiveSample, instance: Instance) -> int | None:
    value = sample.get("pstate")  # "P0" .. "P15"
    return int(value[1:]) if value else None


def throttle_reasons(sample: LiveSample, instance: Instance) -> int | None:
    reasons = sample.get("throttle_reasons")
    return None if reasons is None else throttle_reason_mask(reasons)


DCGM_FIELDS = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", key("sm_clock_mhz")),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", key("mem_clock_mhz")),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", key("memory_temperature_c")),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", key("temperature_c")),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", key("power_w")),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        key("energy_mj"),
        counter=True,
    ),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", key("utilization_gpu_pct")),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", key("utilization_memory_pct")
    ),
    DcgmField("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", memory_free),
    DcgmField("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", memory_used),
    DcgmField("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", key("fan_pct")),
    DcgmField("DCGM_FI_DEV_PSTATE", "Performance state (P0 is the fastest).", pstate),
    DcgmField(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (a bitmask of NVML's clock event reasons).",
        throttle_reasons,
    ),
    # NVML samples PCIe throughput in KB/s (DCGM's own *_THROUGHPUT fields keep that unit).
    DcgmField(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "PCIe transmit throughput (in KB/s).",
        key("pcie_tx_kbps"),
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "PCIe receive throughput (in KB/s).",
        key("pcie_rx_kbps"),
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        key("ecc_corrected"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        key("ecc_uncorrected"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        key("ecc_corrected_total"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        key("ecc_uncorrected_total"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_RETIRED_SBE",
        "Total number of retired pages due to single-bit errors.",
        key("retired_pages_sbe"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_RETIRED_DBE",
        "Total number of retired pages due to double-bit errors.",
        key("retired_pages_dbe"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Total number of pages pending retirement.",
        key("retired_pages_pending"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        key("remapped_rows_uncorrectable"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        key("remapped_rows_correctable"),
        counter=True,
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed",
        key("remapped_rows_failure"),
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether remapping of rows is pending",
        key("remapped_rows_pending"),
    ),
)
# The DCGM fields that are a sample's own field, read for all of them at once.
SAMPLE_KEYS = tuple(field.read.name for field in DCGM_FIELDS if isinstance(field.read, key))
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
NVLINK_HELP = "NVLink CRC (flit and data), replay and recovery errors, summed over the GPU's links."
GPU_STATE_HELP = "1 for the GPU's state (stored, or missing when its node no longer reports it)."
GPUS_HELP = "GPUs per state."
REACHABLE_HELP = "1 while the node's agent heartbeats within GPUADMIN_HEARTBEAT_GRACE_S, else 0."
ALERTS_HELP = "Alerts firing, by severity."


class GpuRow(NamedTuple):
    """What a scrape reads of a GPU (a tuple: 4,000 built per whole-fleet scrape)."""

    pk: int
    uuid: str
    # Shadows tuple.index on purpose (the label's source): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    model_name: str
    state: str
    missing: bool
    hostname: str

    @property
    def label_values(self) -> tuple[str, str, int, str]:
        """What ``labels`` is written from: a key for its text (``LabelTexts``)."""
        return (self.hostname, self.uuid, self.index, self.model_name)

    @property
    def labels(self) -> dict[str, str]:
        return {
            "gpu": str(self.index),
            "UUID": self.uuid,
            "device": f"nvidia{self.index}",
            "modelName": self.model_name,
            "Hostname": self.hostname,
        }


def gpu_rows(hostname: str | None = None) -> list[GpuRow]:
    """Every GPU of the catalog (or of one node), in one query."""
    gpus = Gpu.objects.all() if hostname is None else Gpu.objects.filter(node__hostname=hostname)
    rows = gpus.order_by("node__hostname", "index").values_list(
        "pk", "uuid", "index", "name", "state", "missing_since", "node__hostname"
    )
    return [
        GpuRow(pk, uuid, index, name, state, missing_since is not None, hostname)
        for pk, uuid, index, name, state, missing_since, hostname in rows
    ]


def last_xids(gpu_ids: list[int] | None = None) -> dict[int, int | None]:
    """GPU id -> the XID of its latest XID event (one query, on the GPU/time index), of every
    GPU or of those named."""
    events = HealthEvent.objects.filter(kind=EventKind.XID, gpu__isnull=False, xid__isnull=False)
    if gpu_ids is not None:
        events = events.filter(gpu_id__in=gpu_ids)
    return dict(
        events.order_by("gpu_id", "-occurred_at").distinct("gpu_id").values_list("gpu_id", "xid")
    )


def gpu_instance_profile(profile: str) -> str:
    """A GPU instance's profile from its MIG device's: "1c.3g.20gb" (a compute instance
    smaller than its GPU instance) -> "3g.20gb"; "1g.6gb" stays."""
    head, _, rest = profile.partition(".")
    return rest if head.endswith("c") else profile


def gpu_instances(sample: LiveSample) -> list[tuple[dict[str, str], Instance]]:
    """The MIG labels and instance of each series a GPU gets: one per GPU instance in MIG
    mode (its first compute instance stands for it), else one without MIG labels."""
    first: dict[int, MigDeviceSample] = {}
    for instance in sample.get("mig") or ():
        first.setdefault(instance["gi_id"], instance)
    if not first:
        return [({}, None)]
    return [
        (
            {
                "GPU_I_PROFILE": gpu_instance_profile(instance.get("profile") or ""),
                "GPU_I_ID": str(gi_id),
            },
            instance,
        )
        for gi_id, instance in first.items()
    ]


def number(value: Any) -> float | None:
    """A sample value as a float; None (not reported) stays None, never 0."""
    return None if value is None else float(value)


def gpu_state(row: GpuRow) -> str:
    return MISSING if row.missing else row.state


def state_counts(rows: list[GpuRow]) -> list[tuple[str, int]]:
    """(state, GPUs) for every state, 0 included, in name order."""
    counts: Counter[str] = Counter(dict.fromkeys([*GpuState.values, MISSING], 0))
    counts.update(gpu_state(row) for row in rows)
    return sorted(counts.items())


def node_reachability(hostname: str | None = None) -> list[tuple[str, float]]:
    """(hostname, 1.0 or 0.0) of every node (or of the one named), in hostname order."""
    cutoff = heartbeat_cutoff()
    nodes = Node.objects.all() if hostname is None else Node.objects.filter(hostname=hostname)
    return [
        (name, float(heartbeat is not None and heartbeat >= cutoff))
        for name, heartbeat in nodes.order_by("hostname").values_list(
            "hostname", "last_heartbeat_at"
        )
    ]


def firing_alerts() -> list[tuple[str, int]]:
    """(severity, alerts firing) for every severity, 0 included."""
    counts = dict.fromkeys(Severity.values, 0)
    counts.update(
        Alert.objects.filter(state=AlertState.FIRING)
        .order_by()
        .values_list("severity")
        .annotate(n=Count("pk"))
    )
    return list(counts.items())


class HealthCollector(Collector):
    """Reads the catalog, the live samples, XID events and firing alerts at each scrape.

    ``/metrics`` is served by ``text()``, which writes the same lines directly; ``collect()``
    (prometheus-client's families) is the reference the tests hold ``text()`` to."""

    def text(self, hostname: str | None = None, *, nodes: bool = True, fleet: bool = True) -> str:
        """The text format of what ``collect()`` yields, in its order: the series of every node
        (or of ``hostname``'s alone) when ``nodes``, the fleet's totals when ``fleet``. An
        unknown ``hostname`` raises ``UnknownNode``."""
        return HealthText(hostname).render(nodes=nodes, fleet=fleet)

    def hostnames(self) -> list[str]:
        """The nodes a per-node scrape can name (``/metrics/targets``)."""
        return list(Node.objects.order_by("hostname").values_list("hostname", flat=True))

    def collect(self) -> Iterator[Metric]:
        rows = gpu_rows()
        samples_by_node = live.latest(sorted({row.hostname for row in rows}))
        yield from self.dcgm(rows, samples_by_node)
        yield from self.gpu_states(rows)
        yield from self.nodes()
        yield from self.alerts()

    def dcgm(
        self, rows: list[GpuRow], samples_by_node: dict[str, dict[str, LiveSample]]
    ) -> Iterator[Metric]:
        families = {
            field.name: (UnknownMetricFamily if field.counter else GaugeMetricFamily)(
                field.name, field.documentation
            )
            for field in DCGM_FIELDS
        }
        xid = GaugeMetricFamily(*XID_ERRORS)
        nvlink = CounterMetricFamily("gpuadmin_gpu_nvlink_errors", NVLINK_HELP)
        xids = last_xids()
        for row in rows:
            sample = samples_by_node.get(row.hostname, {}).get(row.uuid)
            if sample is None:
                continue  # no live sample: nothing to say, as dcgm-exporter on a down node
            base = row.labels
            for extra, instance in gpu_instances(sample):
                labels = {**base, **extra}
                for field in DCGM_FIELDS:
                    value = number(field.read(sample, instance))
                    if value is not None:
                        families[field.name].add_sample(field.name, labels, value)
                # DCGM's XID field is 0 until the GPU's first XID.
                xid.add_sample(xid.name, labels, float(xids.get(row.pk) or 0))
            errors = number(sample.get("nvlink_errors"))
            if errors is not None:
                nvlink.add_sample(nvlink.name + "_total", base, errors)
        # A field no GPU reports (fans on SXM boards) is left out, as dcgm-exporter leaves it.
        yield from (family for family in (*families.values(), xid, nvlink) if family.samples)

    def gpu_states(self, rows: list[GpuRow]) -> Iterator[Metric]:
        per_gpu = GaugeMetricFamily("gpuadmin_gpu_state", GPU_STATE_HELP)
        for row in rows:
            per_gpu.add_sample(per_gpu.name, {**row.labels, "state": gpu_state(row)}, 1.0)
        totals = GaugeMetricFamily("gpuadmin_gpus", GPUS_HELP, labels=["state"])
        for state, count in state_counts(rows):
            totals.add_metric([state], count)
        yield per_gpu
        yield totals

    def nodes(self) -> Iterator[Metric]:
        reachable = GaugeMetricFamily(
            "gpuadmin_node_reachable", REACHABLE_HELP, labels=["Hostname"]
        )
        for hostname, up in node_reachability():
            reachable.add_metric([hostname], up)
        yield reachable

    def alerts(self) -> Iterator[Metric]:
        firing = GaugeMetricFamily("gpuadmin_alerts_firing", ALERTS_HELP, labels=["severity"])
        for severity, count in firing_alerts():
            firing.add_metric([severity], count)
        yield firing


# The text format written directly: at 500 nodes x 8 GPUs a scrape is ~128,000 samples, and a
# prometheus-client sample object per series (a labels dict, sorted and escaped at each line)
# took most of the scrape's time. The lines are byte for byte what generate_latest() writes
# for the families collect() yields (tests/health/test_metrics.py compares them).


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # the common case: three scans, no copies
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(labels: dict[str, str]) -> str:
    """``{a="1",b="2"}``: prometheus-client's order (sorted names) and escaping."""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def header(name: str, documentation: str, kind: str) -> str:
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


class _Values(dict[Any, str]):
    """A sample value -> its text (Go's float format) and the line's end, each distinct value
    formatted once."""

    def __missing__(self, value: Any) -> str:
        text = self[value] = floatToGoString(float(value)) + "\n"
        return text


def family_lines(name: str, labels: Sequence[str], raws: Sequence[Any], values: _Values) -> str:
    """The lines ``name{labels} value`` of the series whose value (``raws``, one per entry of
    ``labels``) is not None. Written by C loops (zip, map, join) over the family, not a Python
    statement per sample: 27 families x ~5,000 series at 500 nodes."""
    if None in raws:
        kept = list(map(is_not, raws, repeat(None)))
        labels, raws = list(compress(labels, kept)), list(compress(raws, kept))
    return "".join(chain.from_iterable(zip(repeat(name), labels, map(values.__getitem__, raws))))


class LabelTexts:
    """The label text (and its space) of a GPU's series, by the values it is written from.

    A whole-fleet scrape reads the previous one's texts and keeps its own for the next (about
    9,700 at 500 nodes; writing them took a sixth of a scrape's CPU). Only label text is kept,
    each under the values it was written from: a renamed model, a GPU's new index or node, a
    new MIG layout or state is a new key, never a stale text, and the texts no scrape asked
    for go with the old dict. A node's scrape reads them and keeps nothing."""

    _kept: ClassVar[dict[tuple[Any, ...], str]] = {}

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.previous = LabelTexts._kept
        self.texts: dict[tuple[Any, ...], str] = {}

    def __call__(self, row: GpuRow, extra: dict[str, str] | None = None) -> str:
        """``label_text`` of the row's labels and ``extra``, a space after it."""
        key = (row.label_values, tuple(extra.items()) if extra else ())
        text = self.previous.get(key)
        if text is None:
            text = label_text({**row.labels, **extra} if extra else row.labels) + " "
        self.texts[key] = text
        return text

    def done(self) -> None:
        """The scrape is written: its texts are the next one's, when it keeps them."""
        if self.keep:
            LabelTexts._kept = self.texts


class HealthText:
    """``HealthCollector.collect()``'s families as text, for the fleet or one node."""

    def __init__(self, hostname: str | None) -> None:
        self.hostname = hostname
        self.values = _Values()
        self.labels = LabelTexts(keep=hostname is None)

    def render(self, *, nodes: bool, fleet: bool) -> str:
        parts: list[str] = []
        values = self.values
        if nodes or fleet:
            rows = gpu_rows(self.hostname)
        if nodes:
            reachable = node_reachability(self.hostname)
            if self.hostname is not None and not reachable:
                raise UnknownNode(self.hostname)
            parts += self.dcgm(rows, live.latest(sorted({row.hostname for row in rows})))
            parts.append(header("gpuadmin_gpu_state", GPU_STATE_HELP, "gauge"))
            parts.append(
                family_lines(
                    "gpuadmin_gpu_state",
                    [self.labels(row, {"state": gpu_state(row)}) for row in rows],
                    [1.0] * len(rows),
                    values,
                )
            )
        if fleet:
            parts.append(header("gpuadmin_gpus", GPUS_HELP, "gauge"))
            parts += [
                f'gpuadmin_gpus{{state="{_escape(state)}"}} {values[count]}'
                for state, count in state_counts(rows)
            ]
        if nodes:
            parts.append(header("gpuadmin_node_reachable", REACHABLE_HELP, "gauge"))
            parts += [
                f'gpuadmin_node_reachable{{Hostname="{_escape(name)}"}} {values[up]}'
                for name, up in reachable
            ]
        if fleet:
            parts.append(header("gpuadmin_alerts_firing", ALERTS_HELP, "gauge"))
            parts += [
                f'gpuadmin_alerts_firing{{severity="{_escape(severity)}"}} {values[count]}'
                for severity, count in firing_alerts()
            ]
        self.labels.done()
        return "".join(parts)

    def dcgm(
        self, rows: list[GpuRow], samples_by_node: dict[str, dict[str, LiveSample]]
    ) -> list[str]:
        values = self.values
        xids = last_xids([row.pk for row in rows] if self.hostname else None)
        # Each series' label text (and its space), sample, MIG instance and XID, in parallel
        # lists: the labels written once for all its fields.
        labels: list[str] = []
        samples: list[LiveSample] = []
        instances: list[Instance] = []
        sample_values: list[tuple[Any, ...]] = []  # the SAMPLE_KEYS' values
        xid_values: list[int] = []
        nvlink_labels: list[str] = []
        nvlink_values: list[Any] = []
        for row in rows:
            sample = samples_by_node.get(row.hostname, {}).get(row.uuid)
            if sample is None:
                continue  # no live sample: nothing to say, as dcgm-exporter on a down node
            base_text = self.labels(row)
            own = tuple(map(sample.get, SAMPLE_KEYS))
            xid = xids.get(row.pk) or 0  # DCGM's XID field is 0 until the GPU's first XID
            for extra, instance in gpu_instances(sample):
                labels.append(self.labels(row, extra) if extra else base_text)
                samples.append(sample)
                instances.append(instance)
                sample_values.append(own)
                xid_values.append(xid)
            nvlink_labels.append(base_text)
            nvlink_values.append(sample.get("nvlink_errors"))
        if not labels:
            return []  # no GPU has a live sample
        # A column per sample key (zip transposes the rows): read once per GPU, not per field.
        columns = dict(zip(SAMPLE_KEYS, zip(*sample_values, strict=True), strict=True))
        parts: list[str] = []
        for field in DCGM_FIELDS:
            read = field.read
            raws = (
                columns[read.name] if isinstance(read, key) else list(map(read, samples, instances))
            )
            # A field no GPU reports is left out, as dcgm-exporter leaves it.
            if lines := family_lines(field.name, labels, raws, values):
                kind = "untyped" if field.counter else "gauge"
                parts += [header(field.name, field.documentation, kind), lines]
        name, documentation = XID_ERRORS
        parts += [
            header(name, documentation, "gauge"),
            family_lines(name, labels, xid_values, values),
        ]
        if lines := family_lines(NVLINK_TOTAL, nvlink_labels, nvlink_values, values):
            parts += [header(NVLINK_TOTAL, NVLINK_HELP, "counter"), lines]
        return parts


NVLINK_TOTAL = "gpuadmin_gpu_nvlink_errors_total"

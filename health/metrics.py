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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Count
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

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


def key(name: str) -> Callable[[LiveSample, Instance], Any]:
    """The sample's own field ``name`` (the same for every MIG instance of the GPU)."""

    def read(sample: LiveSample, instance: Instance) -> Any:
        return sample.get(name)

    return read


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
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")


@dataclass(frozen=True)
class GpuRow:
    pk: int
    uuid: str
    index: int
    model_name: str
    state: str
    missing: bool
    hostname: str

    @property
    def labels(self) -> dict[str, str]:
        return {
            "gpu": str(self.index),
            "UUID": self.uuid,
            "device": f"nvidia{self.index}",
            "modelName": self.model_name,
            "Hostname": self.hostname,
        }


def gpu_rows() -> list[GpuRow]:
    """Every GPU of the catalog, in one query."""
    rows = Gpu.objects.order_by("node__hostname", "index").values_list(
        "pk", "uuid", "index", "name", "state", "missing_since", "node__hostname"
    )
    return [
        GpuRow(pk, uuid, index, name, state, missing_since is not None, hostname)
        for pk, uuid, index, name, state, missing_since, hostname in rows
    ]


def last_xids() -> dict[int, int | None]:
    """GPU id -> the XID of its latest XID event (one query, on the GPU/time index)."""
    return dict(
        HealthEvent.objects.filter(kind=EventKind.XID, gpu__isnull=False, xid__isnull=False)
        .order_by("gpu_id", "-occurred_at")
        .distinct("gpu_id")
        .values_list("gpu_id", "xid")
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


class HealthCollector(Collector):
    """Reads the catalog, the live samples, XID events and firing alerts at each scrape."""

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
        nvlink = CounterMetricFamily(
            "gpuadmin_gpu_nvlink_errors",
            "NVLink CRC (flit and data), replay and recovery errors, summed over the GPU's links.",
        )
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
        per_gpu = GaugeMetricFamily(
            "gpuadmin_gpu_state",
            "1 for the GPU's state (stored, or missing when its node no longer reports it).",
        )
        counts: Counter[str] = Counter(dict.fromkeys([*GpuState.values, MISSING], 0))
        for row in rows:
            state = MISSING if row.missing else row.state
            counts[state] += 1
            per_gpu.add_sample(per_gpu.name, {**row.labels, "state": state}, 1.0)
        totals = GaugeMetricFamily("gpuadmin_gpus", "GPUs per state.", labels=["state"])
        for state, count in sorted(counts.items()):
            totals.add_metric([state], count)
        yield per_gpu
        yield totals

    def nodes(self) -> Iterator[Metric]:
        reachable = GaugeMetricFamily(
            "gpuadmin_node_reachable",
            "1 while the node's agent heartbeats within GPUADMIN_HEARTBEAT_GRACE_S, else 0.",
            labels=["Hostname"],
        )
        cutoff = heartbeat_cutoff()
        for hostname, heartbeat in Node.objects.order_by("hostname").values_list(
            "hostname", "last_heartbeat_at"
        ):
            reachable.add_metric([hostname], float(heartbeat is not None and heartbeat >= cutoff))
        yield reachable

    def alerts(self) -> Iterator[Metric]:
        firing = GaugeMetricFamily(
            "gpuadmin_alerts_firing", "Alerts firing, by severity.", labels=["severity"]
        )
        counts = dict.fromkeys(Severity.values, 0)
        counts.update(
            Alert.objects.filter(state=AlertState.FIRING)
            .order_by()
            .values_list("severity")
            .annotate(n=Count("pk"))
        )
        for severity, count in counts.items():
            firing.add_metric([severity], count)
        yield firing

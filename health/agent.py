"""The node agent's side of health: what it detects on its GPUs and reports to the central side.

``HealthWatcher`` compares each live sample (``inventory.signals.sample_taken``) with the
previous one of the same GPU UUID and reports what changed for the worse: ECC counters, retired
pages, row remapping, thermal and power-brake clock events, NVLink errors, a GPU that fell off
the bus, queries that keep failing. ``XidListener`` waits on NVML's event API and reports each
XID at once. Both send ``health.wire.HealthReport`` batches through one ``Outbox``, which keeps
what the broker refused (bounded) and sends it again with the next report or sample.

Each report's ``key`` names its occurrence (a counter's new value, the start of an episode, an
XID's arrival), so a resend, or the same state seen again by a restarted agent, is stored once.
The agent runs them only while ``gpuadmin agent`` runs (``start``/``HealthAgent.stop``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from health.choices import EventKind
from health.wire import HealthReport
from inventory import live
from inventory.nvml.scanner import (
    POWER_BRAKE_REASONS,
    THERMAL_REASONS,
    GpuMetrics,
    GpuScan,
    HealthCounters,
    NodeScan,
)
from inventory.nvml.xid_events import XidEvent, XidWatch
from inventory.signals import sample_taken

log = logging.getLogger("gpuadmin.agent")

REPORT_TASK = "health.report"
# Reports kept while the broker is away; past it the oldest go (and the loss is logged).
MAX_UNSENT = 1000

Send = Callable[..., Any]


class Outbox:
    """Reports on their way to the central worker, oldest first, resent until delivered."""

    def __init__(self, hostname: str, send: Send, *, limit: int = MAX_UNSENT) -> None:
        self.hostname = hostname
        self.send = send
        self.unsent: deque[HealthReport] = deque(maxlen=limit)
        self.lock = threading.Lock()
        self.failing = False

    def put(self, reports: Iterable[HealthReport]) -> bool:
        """Queue reports and send everything unsent; ``False`` when the broker refused (kept)."""
        with self.lock:
            for report in reports:
                if len(self.unsent) == self.unsent.maxlen:
                    log.error(
                        "agent %s: health report %s dropped", self.hostname, self.unsent[0].key
                    )
                self.unsent.append(report)
            return self._flush()

    def _flush(self) -> bool:
        if not self.unsent:
            return True
        batch = list(self.unsent)
        try:
            self.send(REPORT_TASK, args=(self.hostname, [report.to_dict() for report in batch]))
        except (KombuError, OSError, RedisError) as exc:
            if not self.failing:
                log.warning(
                    "agent %s: cannot send %d health report(s) (%s); kept and resent",
                    self.hostname,
                    len(batch),
                    exc,
                )
                self.failing = True
            return False
        for _ in batch:
            self.unsent.popleft()
        if self.failing:
            log.info("agent %s: held health reports delivered", self.hostname)
            self.failing = False
        return True


class HealthWatcher:
    """Compares each sample of the node with the previous one, per GPU UUID."""

    def __init__(
        self,
        hostname: str,
        outbox: Outbox,
        *,
        query_failures: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hostname = hostname
        self.outbox = outbox
        self.query_failures = query_failures or settings.GPUADMIN_QUERY_FAILURES
        self.clock = clock
        self.previous: dict[str, GpuScan] = {}  # UUID -> its last answering scan
        self.failing_since: dict[str, tuple[float, int]] = {}  # UUID -> (first failure, count)
        self.lost_since: dict[str, float] = {}

    def on_sample(self, sender: Any, hostname: str, scan: NodeScan, **_: Any) -> None:
        """The ``sample_taken`` receiver: report what changed (and what is still unsent)."""
        if hostname == self.hostname:
            self.outbox.put(self.compare(scan))

    def compare(self, scan: NodeScan) -> list[HealthReport]:
        now = self.clock()
        reports: list[HealthReport] = []
        for gpu in scan.gpus:
            uuid = live.gpu_uuid(self.hostname, gpu)
            if uuid is None:  # failed before its UUID was ever read: nothing to name it by
                continue
            if gpu.facts.error_message:
                reports.extend(self._failed(gpu, uuid, now))
                continue
            self.lost_since.pop(uuid, None)
            self.failing_since.pop(uuid, None)
            before = self.previous.get(uuid)
            self.previous[uuid] = gpu
            reports.extend(_Changes(before, gpu, uuid, now).find())
        return reports

    def _failed(self, gpu: GpuScan, uuid: str, now: float) -> list[HealthReport]:
        error = gpu.facts.error_message or ""
        if gpu.health is not None and gpu.health.gpu_lost:
            if uuid in self.lost_since:
                return []
            self.lost_since[uuid] = now
            return [
                _report(
                    EventKind.GPU_LOST,
                    f"{int(now * 1000)}",
                    gpu,
                    uuid,
                    now,
                    error,
                    {"error": error},
                )
            ]
        first, count = self.failing_since.get(uuid, (now, 0))
        self.failing_since[uuid] = (first, count + 1)
        if count + 1 != self.query_failures:
            return []
        message = f"NVML queries failed in {count + 1} consecutive samples: {error}"
        data = {"error": error, "samples": count + 1, "since": first}
        return [
            _report(EventKind.QUERY_FAILING, f"{int(first * 1000)}", gpu, uuid, now, message, data)
        ]


def _report(
    kind: str,
    occurrence: str,
    gpu: GpuScan,
    uuid: str,
    at: float,
    message: str,
    data: dict[str, Any],
) -> HealthReport:
    return HealthReport(
        kind=str(kind),
        key=f"{kind}:{uuid}:{occurrence}",
        occurred_at=at,
        gpu_index=gpu.facts.index,
        gpu_uuid=uuid,
        message=message,
        data=data,
    )


def _rise(before: int | None, after: int | None) -> int:
    """How much a counter rose (0 when it did not, or when either value is unknown)."""
    if before is None or after is None or after <= before:
        return 0
    return after - before


def _counter(health: HealthCounters, volatile: str, aggregate: str) -> int | None:
    """The volatile ECC count, or the aggregate one where the GPU keeps only that."""
    value = getattr(health, volatile)
    return getattr(health, aggregate) if value is None else value


def _remap_state(health: HealthCounters | None) -> dict[str, Any] | None:
    if health is None:
        return None
    return {
        "correctable": health.remapped_rows_correctable,
        "uncorrectable": health.remapped_rows_uncorrectable,
        "pending": health.remapped_rows_pending,
        "failure": health.remapped_rows_failure,
    }


class _Changes:
    """What got worse between two answering scans of one GPU. Counters need a previous
    sample; flags (pending, failure, clock events) are news on the first one too."""

    def __init__(self, before: GpuScan | None, gpu: GpuScan, uuid: str, at: float) -> None:
        self.gpu, self.uuid, self.at = gpu, uuid, at
        self.then = None if before is None else before.health
        self.reports: list[HealthReport] = []

    def add(self, kind: str, occurrence: str, message: str, data: dict[str, Any]) -> None:
        self.reports.append(_report(kind, occurrence, self.gpu, self.uuid, self.at, message, data))

    def find(self) -> list[HealthReport]:
        now = self.gpu.health
        if now is not None:
            self.ecc(now)
            self.retired_pages(now)
            self.remapped_rows(now)
            self.clock_events(now)
            self.nvlink(now)
        return self.reports

    def ecc(self, now: HealthCounters) -> None:
        for kind, volatile, aggregate in (
            (EventKind.ECC_CORRECTED, "ecc_volatile_corrected", "ecc_aggregate_corrected"),
            (EventKind.ECC_UNCORRECTED, "ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"),
        ):
            old = None if self.then is None else _counter(self.then, volatile, aggregate)
            new = _counter(now, volatile, aggregate)
            if delta := _rise(old, new):
                total = getattr(now, aggregate)
                # The aggregate count tells a rise apart from the same value after a reset.
                self.add(
                    kind,
                    f"{new}:{total}",
                    f"{old} -> {new}",
                    {"before": old, "after": new, "delta": delta, "aggregate": total},
                )

    def retired_pages(self, now: HealthCounters) -> None:
        then = self.then
        pages = (now.retired_pages_sbe, now.retired_pages_dbe)
        old = (None, None) if then is None else (then.retired_pages_sbe, then.retired_pages_dbe)
        pending = bool(now.retired_pages_pending)
        newly_pending = pending and not (then and then.retired_pages_pending)
        if newly_pending or any(_rise(a, b) for a, b in zip(old, pages, strict=True)):
            self.add(
                EventKind.RETIRED_PAGES,
                f"{pages[0]}:{pages[1]}:{int(pending)}",
                f"single-bit {pages[0]}, double-bit {pages[1]}"
                + (", retirement pending a reset" if pending else ""),
                {
                    "before": {"sbe": old[0], "dbe": old[1]},
                    "after": {"sbe": pages[0], "dbe": pages[1]},
                    "pending": pending,
                },
            )

    def remapped_rows(self, now: HealthCounters) -> None:
        then = self.then
        rows = f"{now.remapped_rows_correctable}:{now.remapped_rows_uncorrectable}"
        data = {"before": _remap_state(then), "after": _remap_state(now)}
        if now.remapped_rows_failure and not (then and then.remapped_rows_failure):
            self.add(
                EventKind.REMAP_FAILURE,
                rows,
                "no spare rows left in a bank",
                data,
            )
        newly_pending = now.remapped_rows_pending and not (then and then.remapped_rows_pending)
        uncorrectable = then is not None and _rise(
            then.remapped_rows_uncorrectable, now.remapped_rows_uncorrectable
        )
        if newly_pending or uncorrectable:
            self.add(
                EventKind.REMAP_PENDING,
                rows,
                f"rows remapped for uncorrectable errors: {now.remapped_rows_uncorrectable}"
                + (", pending a GPU reset" if now.remapped_rows_pending else ""),
                data,
            )

    def clock_events(self, now: HealthCounters) -> None:
        reasons = set(now.throttle_reasons)
        old = set(self.then.throttle_reasons) if self.then is not None else set()
        metrics = self.gpu.metrics or GpuMetrics()
        for kind, watched in (
            (EventKind.THERMAL, THERMAL_REASONS),
            (EventKind.POWER, POWER_BRAKE_REASONS),
        ):
            if appeared := sorted((reasons & watched) - old):
                self.add(
                    kind,
                    f"{int(self.at * 1000)}",  # the episode starts now
                    f"clock event: {', '.join(appeared)}",
                    {
                        "reasons": sorted(reasons),
                        "appeared": appeared,
                        "temperature_c": metrics.temperature_c,
                        "memory_temperature_c": metrics.memory_temperature_c,
                        "power_w": metrics.power_w,
                    },
                )

    def nvlink(self, now: HealthCounters) -> None:
        old = None if self.then is None else self.then.nvlink_errors
        if delta := _rise(old, now.nvlink_errors):
            self.add(
                EventKind.NVLINK,
                f"{now.nvlink_errors}",
                f"CRC, replay and recovery errors: {old} -> {now.nvlink_errors}",
                {"before": old, "after": now.nvlink_errors, "delta": delta},
            )


class XidListener(threading.Thread):
    """Reports each XID critical error of the node's GPUs at once: the NVML side
    (``inventory.nvml.xid_events.XidWatch``) waits on the event set in this thread."""

    def __init__(
        self,
        hostname: str,
        nvml: Any,
        outbox: Outbox,
        *,
        wait_ms: int = 500,
        retry_s: float = 30.0,
    ) -> None:
        super().__init__(name=f"xid-listener-{hostname}", daemon=True)
        self.outbox = outbox
        self.watch = XidWatch(
            nvml, self._report, label=f"agent {hostname}", wait_ms=wait_ms, retry_s=retry_s
        )
        self.ready = self.watch.ready  # set once the first event set is registered

    def stop(self) -> None:
        self.watch.stop()

    def run(self) -> None:
        self.watch.run()

    def _report(self, event: XidEvent) -> None:
        at = time.time()
        gi, ci, text = event.gpu_instance_id, event.compute_instance_id, event.text
        gpu = event.gpu_uuid or f"gpu{event.gpu_index}"
        where = "" if gi is None else f"GPU instance {gi}, compute instance {ci}"
        report = HealthReport(
            kind=EventKind.XID.value,
            key=f"xid:{gpu}:{event.xid}:{int(at * 1_000_000)}",
            occurred_at=at,
            gpu_index=event.gpu_index,
            gpu_uuid=event.gpu_uuid,
            xid=event.xid,
            message=": ".join(part for part in (where, text) if part),
            data={"gpu_instance_id": gi, "compute_instance_id": ci, "text": text},
        )
        self.outbox.put([report])


class HealthAgent:
    """The watcher (connected to ``sample_taken``) and the XID listener of one agent."""

    def __init__(self, hostname: str, nvml: Any, send: Send) -> None:
        self.outbox = Outbox(hostname, send)
        self.watcher = HealthWatcher(hostname, self.outbox)
        self.listener = XidListener(hostname, nvml, self.outbox)

    def start(self) -> HealthAgent:
        sample_taken.connect(self.watcher.on_sample, weak=False)
        self.listener.start()
        return self

    def stop(self) -> None:
        sample_taken.disconnect(self.watcher.on_sample)
        self.listener.stop()
        self.listener.join(timeout=5)


def start(hostname: str, nvml: Any, send: Send) -> HealthAgent:
    """Start watching this node's GPUs (``gpuadmin agent`` calls it; ``stop()`` on exit)."""
    return HealthAgent(hostname, nvml, send).start()

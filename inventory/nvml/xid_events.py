"""XID critical errors from NVML's event API, as they happen: the NVML side of the node agent's
XID listener (``health.agent.XidListener`` turns each into a health report).

One event set holds every GPU that supports XID events. A lost GPU leaves the set (NVML then
fails every wait with GPU_IS_LOST, and the set is made again at once without it); GPUs that
could not be registered are tried again every ``retry_s``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
from pynvml import NVMLError

from inventory.nvml.scanner import describe_error, instance_id

log = logging.getLogger("gpuadmin.nvml")

XID_EVENTS = pynvml.nvmlEventTypeXidCriticalError


@dataclasses.dataclass(frozen=True)
class XidEvent:
    """One XID as NVML delivered it. The GPU's index and UUID are None when the event names a
    device the set does not know; the instance ids are None without MIG."""

    xid: int
    gpu_index: int | None
    gpu_uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    # The backend's ``event_message``: NVML's event carries no text (the kernel log line
    # does), the simulator tells the injected one.
    text: str


class XidWatch:
    """Waits on an NVML event set for XID critical errors of every GPU and hands each to
    ``on_xid``, from ``run()`` until ``stop()``. ``label`` starts its log lines."""

    def __init__(
        self,
        nvml: Any,
        on_xid: Callable[[XidEvent], None],
        *,
        label: str,
        wait_ms: int = 500,
        retry_s: float = 30.0,
    ) -> None:
        self.nvml = nvml
        self.on_xid = on_xid
        self.label = label
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.stopped = threading.Event()
        self.ready = threading.Event()  # set once the first event set is registered
        self.gpus: dict[int | None, tuple[int, str]] = {}  # handle address -> (index, UUID)
        self.missing = 0  # GPUs that answered no registration

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except NVMLError as err:
            log.warning("%s: no XID events: %s", self.label, describe_error(err))
            self.ready.set()
            return
        events = None
        retry_at = lost_at = 0.0
        try:
            while not self.stopped.is_set():
                if events is None or (self.missing and time.monotonic() >= retry_at):
                    self._free(events)
                    events = self._register()
                    retry_at = time.monotonic() + self.retry_s
                    self.ready.set()
                try:
                    data = nvml.nvmlEventSetWait_v2(events, self.wait_ms)
                except NVMLError as err:
                    if err.value == pynvml.NVML_ERROR_TIMEOUT:
                        continue
                    if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                        # Register again at once, without the lost GPU: an XID of another
                        # GPU while no set is registered would never be seen. Only a GPU
                        # that keeps failing waits while still registering makes it pause.
                        if time.monotonic() - lost_at < 1.0:
                            self.stopped.wait(self.wait_ms / 1000)
                        lost_at = time.monotonic()
                        self._free(events)
                        events = self._register()
                        retry_at = lost_at + self.retry_s
                        continue
                    log.error("%s: XID events: %s", self.label, describe_error(err))
                    self._free(events)
                    events = None
                    self.stopped.wait(self.retry_s)
                    continue
                if data.eventType & XID_EVENTS:
                    self.on_xid(self._event(data, events))
        finally:
            self._free(events)
            try:
                nvml.nvmlShutdown()
            except NVMLError as err:
                log.debug("%s: nvmlShutdown: %s", self.label, describe_error(err))

    def _register(self) -> Any:
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        self.gpus, self.missing = {}, 0
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                if nvml.nvmlDeviceGetSupportedEventTypes(handle) & XID_EVENTS:
                    nvml.nvmlDeviceRegisterEvents(handle, XID_EVENTS, events)
                    self.gpus[_address(handle)] = (index, uuid)
            except NVMLError as err:
                self.missing += 1
                log.debug("%s: GPU %d: no XID events: %s", self.label, index, describe_error(err))
        return events

    def _free(self, events: Any) -> None:
        if events is not None:
            try:
                self.nvml.nvmlEventSetFree(events)
            except NVMLError as err:
                log.debug("%s: nvmlEventSetFree: %s", self.label, describe_error(err))

    def _event(self, data: Any, events: Any) -> XidEvent:
        index, uuid = self.gpus.get(_address(data.device), (None, None))
        return XidEvent(
            xid=int(data.eventData),
            gpu_index=index,
            gpu_uuid=uuid,
            gpu_instance_id=instance_id(data.gpuInstanceId),
            compute_instance_id=instance_id(data.computeInstanceId),
            text=self.nvml.event_message(events) or "",
        )


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: the same for every handle NVML gives of one device."""
    return ctypes.cast(handle, ctypes.c_void_p).value

"""The mutable per-node state (MIG layout, faults, processes, events) and where it is kept.

A node's state is one JSON document. ``MemoryStore`` keeps it in the process; ``FileStore`` keeps
it in ``<state_dir>/<node>.json`` so another process (``gpuadmin sim inject ...``) can change a
running agent's GPUs. Writers take an ``flock`` on ``<node>.json.lock`` and replace the file
atomically (write a temp file, then ``os.replace``); readers never lock and notice a change by the
file's (mtime_ns, inode, size) signature.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import mig
from .model import MachineModel

SCHEMA = 1
MAX_EVENTS = 512
NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when an event or process is not MIG-scoped


class SimStateError(RuntimeError):
    """The state file is missing, unreadable, or does not match the request."""


def _zero_ecc() -> dict[str, dict[str, dict[str, int]]]:
    return {
        counter: {err: {"dram": 0, "sram": 0} for err in ("corrected", "uncorrected")}
        for counter in ("volatile", "aggregate")
    }


def new_gpu_state(mig_capable: bool) -> dict[str, Any]:
    return {
        "mig": {"current": 0, "pending": 0, "instances": []} if mig_capable else None,
        "ecc": _zero_ecc(),
        "retired_pages": {"single_bit": [], "double_bit": [], "pending": False},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "temperature_c": None,
        "temperature_ramp": None,  # {"from_c", "to_c", "start", "over_s"}: metrics.ramped
        "clock_event_reasons": [],  # imposed from outside (power brake, ...): pynvml names
        "nvlink_errors": {},  # link (str) -> {"replay"|"recovery"|"crc_flit"|"crc_data": n}
        "lost": False,
        "fail_code": None,
        "energy_mj": 0.0,
    }


def new_state(
    machine: MachineModel,
    node: str,
    model_ref: str | dict[str, Any],
    salt: int,
    mig_overrides: dict[int, list[Any] | None],
    now: float,
) -> dict[str, Any]:
    """Fresh state: the model's ``initial_state`` with the fleet spec's MIG overrides on top."""
    state: dict[str, Any] = {
        "schema": SCHEMA,
        "node": node,
        "model": model_ref,
        "salt": salt,
        "boot_id": 1,
        "boot_time": now,
        "seq": 0,
        "events": [],
        "processes": [],
        "gpus": [new_gpu_state(g.type.mig_capable) for g in machine.gpus],
    }
    for index, captured in machine.initial_state.get("gpus", {}).items():
        gpu = state["gpus"][int(index)]
        gpu["remapped_rows"].update(captured.get("remapped_rows", {}))
        for counter, errors in captured.get("ecc", {}).items():
            for error, locations in errors.items():
                gpu["ecc"][counter][error].update(locations)
        gpu["clock_event_reasons"] = list(captured.get("clock_event_reasons", []))
    layouts: dict[int, list[Any] | None] = {
        int(k): v for k, v in machine.initial_state.get("mig", {}).items()
    }
    layouts.update(mig_overrides)
    for index, layout in sorted(layouts.items()):
        table = machine.gpus[index].type.mig_table
        if table is None:
            raise ValueError(f"{machine.name}: GPU {index} is not MIG-capable")
        block = state["gpus"][index]["mig"]
        enabled = int(layout is not None)
        block["current"] = block["pending"] = enabled
        if layout:
            mig.apply_layout(table, block, layout)
    return state


def add_event(
    state: dict[str, Any],
    gpu: int,
    event_type: int,
    data: int,
    now: float,
    *,
    gi: int = NO_ID,
    ci: int = NO_ID,
    message: str = "",
) -> None:
    state["seq"] += 1
    event = {"seq": state["seq"], "gpu": gpu, "type": event_type, "data": data, "gi": gi,
             "ci": ci, "time": now, "message": message}  # fmt: skip
    state["events"].append(event)
    del state["events"][:-MAX_EVENTS]


def end_process(state: dict[str, Any], proc: dict[str, Any], now: float) -> None:
    """Remove a process, banking the energy it drew above idle."""
    state["processes"].remove(proc)
    gpu = state["gpus"][proc["gpu"]]
    gpu["energy_mj"] += proc["extra_w"] * max(0.0, now - proc["started_at"]) * 1000.0


def reset_gpu(state: dict[str, Any], index: int, now: float) -> None:
    """What a GPU reset does: pending MIG mode becomes current and MIG instances are gone,
    processes die, volatile ECC counters clear, pending row remaps are applied."""
    gpu = state["gpus"][index]
    for proc in [p for p in state["processes"] if p["gpu"] == index]:
        end_process(state, proc, now)
    if gpu["mig"] is not None:
        gpu["mig"]["current"] = gpu["mig"]["pending"]
        gpu["mig"]["instances"] = []
    for err in gpu["ecc"]["volatile"].values():
        for loc in err:
            err[loc] = 0
    gpu["remapped_rows"]["pending"] = False
    gpu["retired_pages"]["pending"] = False
    gpu["lost"] = False


def reboot(state: dict[str, Any], now: float) -> None:
    """Reset every GPU and restart the driver clock (energy counters, event log)."""
    for index in range(len(state["gpus"])):
        reset_gpu(state, index, now)
        state["gpus"][index]["energy_mj"] = 0.0
    state["boot_id"] += 1
    state["boot_time"] = now
    state["events"] = []


class MemoryStore:
    """State kept in this process only (``state_dir=None``)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state
        self._version = 0
        self.last_signature = 0

    def signature(self) -> int:
        return self._version

    def load(self) -> tuple[dict[str, Any], int]:
        return self._state, self._version

    @contextmanager
    def transaction(self) -> Iterator[dict[str, Any]]:
        yield self._state
        self._version += 1
        self.last_signature = self._version


_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def state_path(state_dir: str | os.PathLike[str], node: str) -> Path:
    if not _SAFE_NODE.match(node):
        raise ValueError(f"node name {node!r} is not usable as a file name")
    return Path(state_dir) / f"{node}.json"


class FileStore:
    """State in ``<state_dir>/<node>.json``, shared between processes."""

    def __init__(self, state_dir: str | os.PathLike[str], node: str) -> None:
        self.path = state_path(state_dir, node)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self.last_signature: tuple[int, int, int] | None = None  # of this store's last write

    def signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> tuple[dict[str, Any], tuple[int, int, int]]:
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                state = json.loads(fh.read())
        except FileNotFoundError as exc:
            raise SimStateError(
                f"no simulator state for node at {self.path}: is its agent running "
                "(gpuadmin up, or gpuadmin agent --node NAME --sim MODEL)?"
            ) from exc
        if state.get("schema") != SCHEMA:
            raise SimStateError(f"{self.path}: unsupported state schema {state.get('schema')}")
        return state, (st.st_mtime_ns, st.st_ino, st.st_size)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, state: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                # dumps: the C encoder (dump streams through the slower pure-Python one;
                # a simulated node's every job start and end rewrites its state).
                fh.write(json.dumps(state, separators=(",", ":")))
                fh.flush()
                # Readers reload when the signature changes. Two writes within one tick of
                # the filesystem's clock, of the same size, can reuse one inode (each replace
                # frees one): a strictly later mtime tells them apart.
                stamp = time.time_ns()
                if (previous := self.signature()) is not None and stamp <= previous[0]:
                    stamp = previous[0] + 1
                os.utime(fh.fileno(), ns=(stamp, stamp))
                st = os.fstat(fh.fileno())
            os.replace(tmp, self.path)
            # The renamed file keeps this inode, so a reader that sees this signature has read
            # exactly what was written here, even if another writer follows immediately.
            self.last_signature = (st.st_mtime_ns, st.st_ino, st.st_size)
        except BaseException:
            os.unlink(tmp)
            raise

    def create_if_missing(self, state: dict[str, Any], *, replace_model: bool = False) -> None:
        """Write ``state`` unless a state file exists (for the same model, if ``replace_model``)."""
        with self._locked():
            if self.exists():
                if not replace_model:
                    return
                current, _ = self.load()
                if current.get("model") == state["model"] and current.get("salt") == state["salt"]:
                    return
            self._write(state)

    @contextmanager
    def transaction(self) -> Iterator[dict[str, Any]]:
        """Lock, load the newest state, let the caller change it, write it back."""
        with self._locked():
            state, _ = self.load()
            yield state
            self._write(state)

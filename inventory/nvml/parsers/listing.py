"""Parser for ``nvidia-smi -L``.

Seen in the captures: drivers 525 .. 610 (Linux and Windows), with and without MIG devices.
MIG lines come in two spellings: ``MIG 3g.40gb Device 0: (UUID: MIG-<uuid>)`` (R470+) and the
older ``MIG 3g.20gb Device 0: (UUID: MIG-GPU-<gpu uuid>/<gi>/<ci>)`` (R450), from which the GPU
and compute instance ids are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ListedGpu", "ListedMigDevice", "parse_gpu_list"]

_GPU_RE = re.compile(
    r"^\s*GPU\s+(?P<index>\d{1,18}):\s+(?P<name>.*?)\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)"
)
_MIG_RE = re.compile(
    r"^\s*(?P<profile>MIG\s+\S+)\s+Device\s+(?P<index>\d{1,18}):\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)"
)
_OLD_MIG_UUID_RE = re.compile(r"^MIG-(?P<gpu>GPU-[0-9a-fA-F-]+)/(?P<gi>\d{1,18})/(?P<ci>\d{1,18})$")


@dataclass(frozen=True)
class ListedMigDevice:
    """``profile`` is the name as printed (``"MIG 3g.40gb"``, ``"MIG 1c.3g.71gb"``);
    ``gpu_instance_id``/``compute_instance_id`` are only known from old-style UUIDs."""

    index: int
    profile: str
    uuid: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    mig_devices: tuple[ListedMigDevice, ...] = ()


def _mig_device(match: re.Match[str]) -> ListedMigDevice:
    uuid = match["uuid"]
    old = _OLD_MIG_UUID_RE.match(uuid)
    return ListedMigDevice(
        index=int(match["index"]),
        profile=" ".join(match["profile"].split()),
        uuid=uuid,
        gpu_instance_id=int(old["gi"]) if old else None,
        compute_instance_id=int(old["ci"]) if old else None,
    )


def parse_gpu_list(text: str) -> list[ListedGpu]:
    """Parse ``nvidia-smi -L`` into GPUs with their nested MIG devices.

    Lines that are neither a GPU nor a MIG device line are ignored; a MIG line before any GPU
    line is dropped.
    """
    gpus: list[ListedGpu] = []
    migs: list[list[ListedMigDevice]] = []
    for line in text.splitlines():
        if gpu := _GPU_RE.match(line):
            gpus.append(ListedGpu(index=int(gpu["index"]), name=gpu["name"], uuid=gpu["uuid"]))
            migs.append([])
        elif (mig := _MIG_RE.match(line)) and migs:
            migs[-1].append(_mig_device(mig))
    return [
        ListedGpu(index=gpu.index, name=gpu.name, uuid=gpu.uuid, mig_devices=tuple(devices))
        for gpu, devices in zip(gpus, migs, strict=True)
    ]

"""Which device nodes a job may open: its own NVIDIA devices, the driver's control devices and
the ordinary pseudo-devices, nothing else (NVIDIA's list, as its container toolkit and Slurm's
``ConstrainDevices`` give a job). Pure: the host's ``/proc`` files are read by the caller."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The NVIDIA driver's fixed character major: ``/dev/nvidia<minor>`` (a GPU),
#: ``/dev/nvidiactl`` and ``/dev/nvidia-modeset``.
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254

PROC_DEVICES = Path("/proc/devices")
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")

#: The pseudo-devices every process expects (runc's defaults): null, zero, full, random,
#: urandom, tty, ptmx and the pseudo-terminals.
PSEUDO_DEVICES = ("c 1:3", "c 1:5", "c 1:7", "c 1:8", "c 1:9", "c 5:0", "c 5:2", "c 136:*")

_RULE = re.compile(r"(?P<type>[cb]) (?P<major>\d+|\*):(?P<minor>\d+|\*)(?: (?P<access>[rwm]+))?")


@dataclass(frozen=True)
class DeviceRule:
    """One allowed device (or every minor of a major, ``minor=None``) of type ``c`` or ``b``,
    for the accesses in ``access`` (``r`` read, ``w`` write, ``m`` mknod)."""

    type: str
    major: int | None
    minor: int | None
    access: str = "rwm"

    @classmethod
    def parse(cls, text: str) -> DeviceRule:
        """``"c 195:0 rwm"`` (the access defaults to ``rwm``; ``*`` for any major or minor)."""
        match = _RULE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a device rule such as 'c 231:* rw'")
        major, minor = match["major"], match["minor"]
        return cls(
            match["type"],
            None if major == "*" else int(major),
            None if minor == "*" else int(minor),
            match["access"] or "rwm",
        )

    def __str__(self) -> str:
        """The cgroup v1 ``devices.allow`` line."""
        major = "*" if self.major is None else self.major
        minor = "*" if self.minor is None else self.minor
        return f"{self.type} {major}:{minor} {self.access}"


@dataclass(frozen=True)
class MigDevice:
    """The MIG device a job uses: its GPU's minor number, GPU instance and compute instance."""

    gpu_minor: int
    gpu_instance: int
    compute_instance: int


def character_majors(proc_devices: str) -> dict[str, int]:
    """The character devices' majors by driver name, from the text of ``/proc/devices``."""
    majors: dict[str, int] = {}
    section = ""
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            section = line
            continue
        number, _, name = line.strip().partition(" ")
        if section.startswith("Character") and number.isdecimal():
            majors.setdefault(name, int(number))
    return majors


def mig_capability_minors(mig_minors: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as ``{"gpu0/gi1/access": 12, ...}``."""
    minors: dict[str, int] = {}
    for line in mig_minors.splitlines():
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdecimal():
            minors[name] = int(number)
    return minors


def job_device_rules(
    gpu_minors: Iterable[int],
    mig_devices: Iterable[MigDevice] = (),
    *,
    majors: Mapping[str, int],
    mig_minors: Mapping[str, int],
    extra: Iterable[DeviceRule] = (),
) -> list[DeviceRule]:
    """The allow-list of a job given GPUs by minor number and MIG devices: its GPUs, nvidiactl,
    nvidia-modeset, nvidia-uvm and nvidia-uvm-tools (whose major the driver chooses: from
    ``majors``, absent without the driver), a MIG device's capability devices (the ``access``
    file of its GPU instance and of its compute instance under ``/dev/nvidia-caps``), the
    pseudo-devices and the ``extra`` rules (the node's setting). ``ValueError`` when a MIG
    device's capabilities are not on a host whose driver has them: the job could not use it
    (a host without the driver, a simulated node, has no capability devices to give)."""
    rules = {DeviceRule.parse(text) for text in PSEUDO_DEVICES} | set(extra)
    minors = {*gpu_minors, NVIDIACTL_MINOR, NVIDIA_MODESET_MINOR}
    minors.update(device.gpu_minor for device in mig_devices)
    rules.update(DeviceRule("c", NVIDIA_MAJOR, minor) for minor in minors)
    if "nvidia-uvm" in majors:  # nvidia-uvm (minor 0) and nvidia-uvm-tools (minor 1)
        rules.update(DeviceRule("c", majors["nvidia-uvm"], minor) for minor in (0, 1))
    caps_major = majors.get("nvidia-caps")
    for device in mig_devices if caps_major is not None else ():  # none without the driver
        instance = f"gpu{device.gpu_minor}/gi{device.gpu_instance}"
        for name in (f"{instance}/access", f"{instance}/ci{device.compute_instance}/access"):
            if name not in mig_minors:
                raise ValueError(f"the MIG capability {name} is not on this host")
            rules.add(DeviceRule("c", caps_major, mig_minors[name]))
    return sorted(rules, key=_order)


def _order(rule: DeviceRule) -> tuple[str, int, int]:
    return (
        rule.type,
        -1 if rule.major is None else rule.major,
        -1 if rule.minor is None else rule.minor,
    )

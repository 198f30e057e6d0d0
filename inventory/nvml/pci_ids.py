"""NVIDIA PCI device ids -> chip, architecture and CUDA compute capability.

Drivers before 470 print no ``product_architecture`` in ``nvidia-smi -q``/``-q -x``, and no
driver prints the compute capability; both follow from the PCI device id (``pci_device_id``
``1DB110DE`` = device ``1DB1`` of vendor ``10DE``). Covers the datacenter GPUs Kepler..Blackwell
and the workstation Blackwell parts whose compute capability differs from the datacenter ones.

Sources: device ids and chip names are the vendor 10de entries of the PCI ID Repository
(https://pci-ids.ucw.cz; ``pci.ids`` of pciutils/pciids, commit 006181e2c5d5). Compute capability
per chip is NVIDIA's tables at https://developer.nvidia.com/cuda-gpus and
https://developer.nvidia.com/cuda-legacy-gpus (K80 3.7, K40/K20 3.5, K10 3.0, M60/M40 5.2,
M10 5.0, P100 6.0, P40/P4 6.1, V100 7.0, T4 7.5, A100/A30 8.0, A40/A10 8.6, L4/L40/L40S 8.9,
H100/H200 9.0, B200/GB200 10.0, B300/GB300 10.3, RTX PRO 6000 Blackwell 12.0).

Plain Python, no Django.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ARCHITECTURE_COMPUTE_CAPABILITY", "NvidiaDevice", "lookup"]

NVIDIA_VENDOR_ID = 0x10DE

# Chip (pci.ids name up to the "GL"/"BGL" board suffix) -> (architecture as nvidia-smi prints
# ``product_architecture``, CUDA compute capability).
_CHIPS: dict[str, tuple[str, tuple[int, int]]] = {
    "GK104": ("Kepler", (3, 0)),
    "GK110": ("Kepler", (3, 5)),
    "GK110B": ("Kepler", (3, 5)),
    "GK180": ("Kepler", (3, 5)),
    "GK210": ("Kepler", (3, 7)),
    "GM107": ("Maxwell", (5, 0)),
    "GM200": ("Maxwell", (5, 2)),
    "GM204": ("Maxwell", (5, 2)),
    "GP100": ("Pascal", (6, 0)),
    "GP102": ("Pascal", (6, 1)),
    "GP104": ("Pascal", (6, 1)),
    "GV100": ("Volta", (7, 0)),
    "TU102": ("Turing", (7, 5)),
    "TU104": ("Turing", (7, 5)),
    "GA100": ("Ampere", (8, 0)),
    "GA102": ("Ampere", (8, 6)),
    "AD102": ("Ada Lovelace", (8, 9)),
    "AD104": ("Ada Lovelace", (8, 9)),
    "GH100": ("Hopper", (9, 0)),
    "GB100": ("Blackwell", (10, 0)),
    "GB102": ("Blackwell", (10, 0)),
    "GB110": ("Blackwell", (10, 3)),
    "GB202": ("Blackwell", (12, 0)),
}

# Device id -> name as in pci.ids (vendor 10de), datacenter parts of each generation.
_DEVICES: dict[int, str] = {
    # Kepler
    0x118F: "GK104GL [Tesla K10]",
    0x1194: "GK104GL [Tesla K8]",
    0x101E: "GK110GL [Tesla K20X]",
    0x101F: "GK110GL [Tesla K20]",
    0x1020: "GK110GL [Tesla K20X]",
    0x1021: "GK110GL [Tesla K20Xm]",
    0x1022: "GK110GL [Tesla K20c]",
    0x1023: "GK110BGL [Tesla K40m]",
    0x1024: "GK180GL [Tesla K40c]",
    0x1026: "GK110GL [Tesla K20s]",
    0x1027: "GK110BGL [Tesla K40st]",
    0x1028: "GK110GL [Tesla K20m]",
    0x1029: "GK110BGL [Tesla K40s]",
    0x102A: "GK110BGL [Tesla K40t]",
    0x102D: "GK210GL [Tesla K80]",
    # Maxwell
    0x13BD: "GM107GL [Tesla M10]",
    0x13F2: "GM204GL [Tesla M60]",
    0x13F3: "GM204GL [Tesla M6]",
    0x17FD: "GM200GL [Tesla M40]",
    # Pascal
    0x15F7: "GP100GL [Tesla P100 PCIe 12GB]",
    0x15F8: "GP100GL [Tesla P100 PCIe 16GB]",
    0x15F9: "GP100GL [Tesla P100 SXM2 16GB]",
    0x15FC: "GP100GL [Tesla P100-DGXS-16GB]",
    0x1B38: "GP102GL [Tesla P40]",
    0x1B39: "GP102GL [Tesla P10]",
    0x1BB3: "GP104GL [Tesla P4]",
    0x1BB4: "GP104GL [Tesla P6]",
    # Volta
    0x1DB1: "GV100GL [Tesla V100 SXM2 16GB]",
    0x1DB2: "GV100GL [Tesla V100 DGXS 16GB]",
    0x1DB3: "GV100GL [Tesla V100 FHHL 16GB]",
    0x1DB4: "GV100GL [Tesla V100 PCIe 16GB]",
    0x1DB5: "GV100GL [Tesla V100 SXM2 32GB]",
    0x1DB6: "GV100GL [Tesla V100 PCIe 32GB]",
    0x1DB7: "GV100GL [Tesla V100 DGXS 32GB]",
    0x1DB8: "GV100GL [Tesla V100 SXM3 32GB]",
    0x1DF5: "GV100GL [Tesla V100 SXM2 16GB]",
    0x1DF6: "GV100GL [Tesla V100S PCIe 32GB]",
    # Turing
    0x1E37: "TU102GL [Tesla T10 16GB / GRID RTX T10-2/T10-4/T10-8]",
    0x1EB8: "TU104GL [Tesla T4]",
    # Ampere
    0x20B0: "GA100 [A100 SXM4 40GB]",
    0x20B1: "GA100 [A100 PCIe 40GB]",
    0x20B2: "GA100 [A100 SXM4 80GB]",
    0x20B3: "GA100 [A100-SXM-64GB]",
    0x20B5: "GA100 [A100 PCIe 80GB]",
    0x20B7: "GA100GL [A30 PCIe]",
    0x20BD: "GA100 [A800 SXM4 40GB]",
    0x20F1: "GA100 [A100 PCIe 40GB]",
    0x20F3: "GA100 [A800-SXM4-80GB]",
    0x20F5: "GA100 [A800 80GB PCIe]",
    0x20F6: "GA100 [A800 40GB PCIe]",
    0x2235: "GA102GL [A40]",
    0x2236: "GA102GL [A10]",
    0x2237: "GA102GL [A10G]",
    0x2238: "GA102GL [A10M]",
    # Ada Lovelace
    0x26B5: "AD102GL [L40]",
    0x26B7: "AD102GL [L20]",
    0x26B8: "AD102GL [L40G]",
    0x26B9: "AD102GL [L40S]",
    0x26BA: "AD102GL [L20]",
    0x27B6: "AD104GL [L2]",
    0x27B8: "AD104GL [L4]",
    # Hopper
    0x2321: "GH100 [H100L 94GB]",
    0x2322: "GH100 [H800 PCIe]",
    0x2324: "GH100 [H800]",
    0x2329: "GH100 [H20]",
    0x2330: "GH100 [H100 SXM5 80GB]",
    0x2331: "GH100 [H100 PCIe]",
    0x2335: "GH100 [H200 SXM 141GB]",
    0x2336: "GH100 [H100]",
    0x2337: "GH100 [H100 SXM5 64GB]",
    0x2338: "GH100 [H100 SXM5 96GB]",
    0x2339: "GH100 [H100 SXM5 94GB]",
    0x233A: "GH100 [H800L 94GB]",
    0x233B: "GH100 [H200 NVL]",
    0x2342: "GH100 [GH200 120GB / 480GB]",
    0x2348: "GH100 [GH200 144G HBM3e]",
    # Blackwell
    0x2901: "GB100 [B200]",
    0x2909: "GB100 [HGX B200 168GB]",
    0x2941: "GB100 [HGX GB200]",
    0x29BC: "GB102 [B100]",
    0x3182: "GB110 [B300 SXM6 AC]",
    0x31C2: "GB110 [GB300]",
    0x31C3: "GB110 [GB300]",
    0x2BB1: "GB202GL [RTX PRO 6000 Blackwell Workstation Edition]",
    0x2BB4: "GB202GL [RTX PRO 6000 Blackwell Max-Q Workstation Edition]",
    0x2BB5: "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
}

# For a GPU whose device id is not above but whose driver prints the architecture: the compute
# capability of that architecture's most common chips (consumer Ampere 8.6, Pascal 6.1, ...).
ARCHITECTURE_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "Kepler": (3, 5),
    "Maxwell": (5, 2),
    "Pascal": (6, 1),
    "Volta": (7, 0),
    "Turing": (7, 5),
    "Ampere": (8, 6),
    "Ada Lovelace": (8, 9),
    "Hopper": (9, 0),
    "Blackwell": (10, 0),
}

_CHIP_RE = re.compile(r"^(?P<chip>[A-Z]{2}\d{3}B?)(?:B?GL)?\b")


@dataclass(frozen=True)
class NvidiaDevice:
    device_id: int
    name: str  # as in pci.ids, e.g. "GV100GL [Tesla V100 SXM2 16GB]"
    architecture: str  # as nvidia-smi prints product_architecture, e.g. "Volta"
    compute_capability: tuple[int, int]


def lookup(pci_device_id: str | None) -> NvidiaDevice | None:
    """The NVIDIA GPU behind ``pci_device_id`` as nvidia-smi prints it (``1DB110DE``,
    ``0x1DB110DE``: device then vendor); ``None`` for other vendors and unknown devices."""
    text = (pci_device_id or "").removeprefix("0x").removeprefix("0X")
    if not re.fullmatch(r"[0-9a-fA-F]{8}", text) or int(text[4:], 16) != NVIDIA_VENDOR_ID:
        return None
    device_id = int(text[:4], 16)
    name = _DEVICES.get(device_id)
    if name is None:
        return None
    match = _CHIP_RE.match(name)
    if match is None:
        return None
    architecture, capability = _CHIPS[match["chip"]]
    return NvidiaDevice(device_id, name, architecture, capability)

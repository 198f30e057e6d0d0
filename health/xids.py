"""NVIDIA's XID catalog as data: what each XID means, whose fault it usually is, and what NVIDIA
recommends doing (its resolution buckets).

``health/data/xid_catalog.json`` is generated from NVIDIA's ``Xid-Catalog.xlsx`` (as CSV
exports) and NVSentinel's XID mapping by ``gpuadmin manage xid_catalog --from DIR``
(:func:`build_catalog`); :func:`lookup` reads it once per process. An XID the catalog does
not know is still stored and alerted (the "unknown XID" recovery policy), never dropped.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "xid_catalog.json"

# The CSV exports of the workbook's sheets, and NVSentinel's mapping, in the fixture folder.
XIDS_CSV = "nvidia__Xid-Catalog.DERIVED__Xids.csv"
BUCKETS_CSV = "nvidia__Xid-Catalog.DERIVED__Resolution_Buckets.csv"
NVLINK5_CSV = "nvidia__Xid-Catalog.DERIVED__Xid_144_150_Decode.csv"
NVSENTINEL_CSV = "nvsentinel__gpu-health-monitor__xiderrorsmapping.csv"

# Who is at fault. The "Xids" sheet has no such column: it is read from NVIDIA's own words
# (the description, the buckets, the trigger conditions), first match in ``_fault`` wins. The
# "Xid 144-150 Decode" sheet has a HW/SW column for the NVLink5 XIDs.
APPLICATION, SOFTWARE, HARDWARE = "application", "software", "hardware"
SECONDARY, UNUSED, UNDETERMINED = "secondary", "unused", "undetermined"
_APPLICATION_BUCKETS = {"CHECK_APP/CUDA", "WORKFLOW_XID_13", "WORKFLOW_XID_31"}
_SOFTWARE_BUCKETS = {"INVESTIGATE_SW", "INVESTIGATE_SW_USER", "UPDATE_SWFW"}
_SECONDARY_BUCKETS = {"XID_154", "IGNORE (sympathetic)", "SYMPATHETIC_REPORT_SOLO"}
_HARDWARE_BUCKETS = {
    "RESET_GPU",
    "RESTART_BM",
    "CHECK_MECHANICALS",
    "WORKFLOW_NVLINK_ERR",
    "WORKFLOW_XID_48",
    "INVESTIGATE_LINK_SI",
}
_MEMORY_WORDS = ("ECC", "memory error", "remapping")
_DECODE_FAULT = {"HW": HARDWARE, "SW": SOFTWARE, "FW": SOFTWARE}


@dataclasses.dataclass(frozen=True)
class XidInfo:
    """One XID of NVIDIA's catalog. ``immediate`` is the resolution bucket of the action that
    gets the system back into service (RESET_GPU, RESTART_APP, IGNORE...), ``investigatory``
    the one to find the cause; ``*_text`` is the bucket's explanation from the catalog."""

    xid: int
    mnemonic: str
    name: str  # the catalog's description: "GPU has fallen off the bus"
    meaning: str  # its trigger conditions, NVIDIA's longer explanation ("" when none)
    fault: str  # application, software, hardware, secondary, unused or undetermined
    immediate: str
    investigatory: str
    immediate_text: str
    investigatory_text: str
    fatal: bool | None  # NVSentinel's FATAL/NONFATAL; None when it does not list the XID
    applies_to: tuple[str, ...]  # the products the catalog says report it (A100, H100...)

    @property
    def title(self) -> str:
        """``XID 79 (GPU has fallen off the bus)``: how events and alerts name it."""
        return f"XID {self.xid} ({self.name})"

    @property
    def subject(self) -> str:
        """The part of the GPU the XID is about when the agent also watches that part by its
        counters or queries: ``gpu_lost`` (fallen off the bus: every query fails too),
        ``memory`` (ECC and row remapping: the counters rise too), ``nvlink`` (the link error
        counters); "" for the others. One fault seen both ways is one alert."""
        if "FALLEN_OFF_THE_BUS" in self.mnemonic:
            return "gpu_lost"
        if any(word in self.name for word in _MEMORY_WORDS):
            return "memory"
        return "nvlink" if self.mnemonic.startswith("NVLINK") else ""

    @property
    def contained(self) -> bool:
        """Whether the catalog says the error stays with the application that met it: XID 94
        (ROBUST_CHANNEL_CONTAINED_ERROR, "all other applications ... are unaffected"), not 95
        (ROBUST_CHANNEL_UNCONTAINED_ERROR). On a MIG GPU the driver names the GPU instance."""
        return "_CONTAINED_" in f"_{self.mnemonic}_"

    def adds_to_name(self, text: str) -> bool:
        """Whether an XID's text (the driver's, the simulator's) says more than its name."""
        said = text.strip().rstrip(".").casefold()
        return bool(said) and said != self.name.casefold()


@functools.cache
def _load() -> tuple[dict[int, XidInfo], dict[str, str]]:
    data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    buckets: dict[str, str] = data["buckets"]
    xids = {}
    for row in data["xids"]:
        xids[row["xid"]] = XidInfo(
            xid=row["xid"],
            mnemonic=row["mnemonic"],
            name=row["name"],
            meaning=row["meaning"],
            fault=row["fault"],
            immediate=row["immediate"],
            investigatory=row["investigatory"],
            immediate_text=buckets.get(row["immediate"], ""),
            investigatory_text=buckets.get(row["investigatory"], ""),
            fatal=row["fatal"],
            applies_to=tuple(row["applies_to"]),
        )
    return xids, buckets


def lookup(xid: int) -> XidInfo | None:
    """The catalog's entry for ``xid``, or ``None`` for an XID it does not know."""
    return _load()[0].get(xid)


def all_xids() -> list[XidInfo]:
    return sorted(_load()[0].values(), key=lambda info: info.xid)


def immediate_buckets() -> set[str]:
    """The resolution buckets the catalog names as an XID's immediate action."""
    return {info.immediate for info in _load()[0].values() if info.immediate}


# --------------------------------------------------------------------------- generation


def _read(folder: Path, name: str) -> list[list[str]]:
    with (folder / name).open(encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fault(description: str, immediate: str, investigatory: str, meaning: str) -> str:
    if description.strip() == "Unused":
        return UNUSED
    if any(word in description for word in _MEMORY_WORDS):
        return HARDWARE  # ECC and row remapping: the memory itself
    if investigatory in _APPLICATION_BUCKETS:
        return APPLICATION
    if investigatory in _SOFTWARE_BUCKETS or immediate in _SOFTWARE_BUCKETS:
        return SOFTWARE
    if immediate in _HARDWARE_BUCKETS or investigatory in _HARDWARE_BUCKETS:
        return HARDWARE
    if "user application" in meaning:
        return APPLICATION
    if investigatory in _SECONDARY_BUCKETS or immediate in _SECONDARY_BUCKETS:
        return SECONDARY
    return UNDETERMINED


def build_catalog(folder: Path) -> dict[str, Any]:
    """The catalog document from the CSV exports in ``folder`` (see the module's names):
    every XID of the "Xids" sheet and of NVSentinel's mapping (one the sheet lacks keeps
    NVSentinel's mnemonic and action)."""
    header, *rows = _read(folder, XIDS_CSV)
    products = [column.split("\n")[-1].strip() for column in header[4:8]]
    buckets = {
        row[0].strip(): row[1].strip() for row in _read(folder, BUCKETS_CSV)[1:] if row and row[0]
    }
    nvsentinel = {int(row[0]): row for row in _read(folder, NVSENTINEL_CSV) if row}
    decode_faults: dict[int, set[str]] = {}
    for row in _read(folder, NVLINK5_CSV)[1:]:
        for part in row[11].split("/"):
            if part.strip() in _DECODE_FAULT:
                decode_faults.setdefault(int(row[0]), set()).add(_DECODE_FAULT[part.strip()])
    xids: dict[int, dict[str, Any]] = {}
    for row in rows:
        if not row or not row[1].strip().isdecimal():
            continue
        xid = int(row[1])
        immediate, investigatory, meaning = row[8].strip(), row[9].strip(), row[11].strip()
        fault = _fault(row[3], immediate, investigatory, meaning)
        if xid in decode_faults:
            fault = "/".join(sorted(decode_faults[xid]))
        mapped = nvsentinel.get(xid)
        xids[xid] = {
            "xid": xid,
            "mnemonic": _one_line(row[2]),
            "name": _one_line(row[3]),
            "meaning": meaning,
            "fault": fault,
            "immediate": immediate,
            "investigatory": investigatory,
            "fatal": None if mapped is None else mapped[3].strip() == "FATAL",
            "applies_to": [
                product
                for product, value in zip(products, row[4:8], strict=True)
                if value.strip() == "YES"
            ],
        }
    for xid, mapped in nvsentinel.items():
        xids.setdefault(
            xid,
            {
                "xid": xid,
                "mnemonic": mapped[1].strip(),
                "name": mapped[1].strip(),
                "meaning": "",
                "fault": UNDETERMINED,
                "immediate": mapped[2].strip(),
                "investigatory": "",
                "fatal": mapped[3].strip() == "FATAL",
                "applies_to": [],
            },
        )
    return {
        "source": (
            "NVIDIA Xid-Catalog.xlsx (sheets Xids, Resolution Buckets, Xid 144-150 Decode) and "
            "NVSentinel's gpu-health-monitor xiderrorsmapping.csv; generated by "
            "`gpuadmin manage xid_catalog --from DIR`"
        ),
        "buckets": buckets,
        "xids": [xids[xid] for xid in sorted(xids)],
    }


def write_catalog(folder: Path, path: Path = CATALOG_PATH) -> int:
    """Regenerate the catalog file from ``folder``; how many XIDs it holds."""
    catalog = build_catalog(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    _load.cache_clear()
    return len(catalog["xids"])

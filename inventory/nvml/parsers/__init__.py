"""Parsers for captured ``nvidia-smi`` output (and kernel Xid lines) into frozen dataclasses.

Plain Python, no Django. Units are normalised: memory in MiB (int), power in W (float), clocks
in MHz (int), temperatures in °C (int); PCI bus ids in the ``00000000:2F:00.0`` form. Values
nvidia-smi reports as ``N/A``/``[Not Supported]``/deprecated become ``None``.
"""

from .capture_bundle import CaptureSection, split_capture_bundle
from .common import (
    ParseError,
    none_if_na,
    normalize_bus_id,
    parse_bool,
    parse_celsius,
    parse_cpu_list,
    parse_mhz,
    parse_mib,
    parse_percent,
    parse_watts,
)
from .listing import ListedGpu, ListedMigDevice, parse_gpu_list
from .mig import (
    ComputeInstance,
    ComputeInstanceProfile,
    GpuInstance,
    GpuInstanceProfile,
    MigPlacements,
    parse_mig_ci_profiles,
    parse_mig_compute_instances,
    parse_mig_gi_profiles,
    parse_mig_gpu_instances,
    parse_mig_placements,
)
from .query_csv import parse_query_csv
from .smi_model import (
    Clocks,
    EccCounts,
    GpuInfo,
    MemoryUsage,
    MigDeviceInfo,
    PowerReadings,
    ProcessInfo,
    RemappedRows,
    RetiredPages,
    SmiLog,
    Temperatures,
)
from .smi_text import parse_smi_text
from .smi_xml import parse_smi_xml
from .topo import TopoDevice, TopoMatrix, parse_topo_matrix
from .xid import XidEvent, parse_xid_line, parse_xid_log

__all__ = [
    "CaptureSection",
    "Clocks",
    "ComputeInstance",
    "ComputeInstanceProfile",
    "EccCounts",
    "GpuInfo",
    "GpuInstance",
    "GpuInstanceProfile",
    "ListedGpu",
    "ListedMigDevice",
    "MemoryUsage",
    "MigDeviceInfo",
    "MigPlacements",
    "ParseError",
    "PowerReadings",
    "ProcessInfo",
    "RemappedRows",
    "RetiredPages",
    "SmiLog",
    "Temperatures",
    "TopoDevice",
    "TopoMatrix",
    "XidEvent",
    "none_if_na",
    "normalize_bus_id",
    "parse_bool",
    "parse_celsius",
    "parse_cpu_list",
    "parse_gpu_list",
    "parse_mhz",
    "parse_mib",
    "parse_mig_ci_profiles",
    "parse_mig_compute_instances",
    "parse_mig_gi_profiles",
    "parse_mig_gpu_instances",
    "parse_mig_placements",
    "parse_percent",
    "parse_query_csv",
    "parse_smi_text",
    "parse_smi_xml",
    "parse_topo_matrix",
    "parse_watts",
    "parse_xid_line",
    "parse_xid_log",
    "split_capture_bundle",
]

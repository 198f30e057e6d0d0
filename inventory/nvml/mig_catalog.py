"""MIG profile tables of the MIG-capable GPU models (``mig_profiles/*.json``).

The tables come from NVIDIA's MIG user guide and real ``nvidia-smi mig -lgip/-lgipp`` captures
(each file names its sources). NVML reports a GPU's profile table only while MIG is enabled, so
the scanner falls back to this catalog for a MIG-capable GPU whose MIG mode is off; the simulator
enforces the same tables.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TABLE_DIR = Path(__file__).with_name("mig_profiles")


@cache
def table_data(name: str) -> dict[str, Any]:
    """The raw JSON of ``mig_profiles/<name>.json``."""
    path = TABLE_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no MIG profile table named {name!r}")
    return json.loads(path.read_text())


@cache
def _table_names_by_gpu() -> dict[str, str]:
    return {
        json.loads(path.read_text())["gpu_name"]: path.stem
        for path in sorted(TABLE_DIR.glob("*.json"))
    }


def table_for_gpu(gpu_name: str) -> dict[str, Any] | None:
    """The table for a GPU by the name NVML reports (e.g. ``NVIDIA A100-SXM4-40GB``)."""
    name = _table_names_by_gpu().get(gpu_name)
    return None if name is None else table_data(name)

"""Scans of simulated nodes, for discovery tests (the real scanner over the NVML simulator)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inventory.nvml.scanner import NodeScan, scan
from inventory.nvml.sim import SimulatedNvml
from inventory.nvml.sim.model import load_model


def model_with_uuids(model: str, node: str) -> dict[str, Any]:
    """The machine model as JSON, each GPU pinned to the UUID it has on ``node``.

    Pinned UUIDs let a test take a GPU out of the chassis, or swap two, and keep identities.
    """
    raw = copy.deepcopy(load_model(model).raw)
    uuids = [gpu.facts.uuid for gpu in scan(SimulatedNvml.from_model(model, node_name=node)).gpus]
    defaults = raw.get("gpu_defaults", {})
    raw["gpus"] = [
        {**defaults, **gpu, "uuid": uuid} for gpu, uuid in zip(raw["gpus"], uuids, strict=True)
    ]
    return raw


@pytest.fixture
def sim_scan():
    """``sim_scan(model, node, ...)`` -> a NodeScan of that simulated node."""

    def make(model: str | dict[str, Any], node: str = "node-01", **kwargs: Any) -> NodeScan:
        return scan(SimulatedNvml.from_model(model, node_name=node, **kwargs))

    return make

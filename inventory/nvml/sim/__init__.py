"""NVML simulator: a pynvml look-alike driven by machine models (see README.md)."""

from .backend import SimulatedNvml
from .model import list_models, load_fleet, load_model

__all__ = ["SimulatedNvml", "list_models", "load_fleet", "load_model"]

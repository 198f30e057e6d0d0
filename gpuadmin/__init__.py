"""gpuadmin: run an NVIDIA GPU fleet."""

__version__ = "0.1.0"

"""GPU sharing: the MIG devices and MPS shares the placement loop hands out, and MIG re-layouts."""

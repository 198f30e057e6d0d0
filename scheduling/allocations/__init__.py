"""GPUs given to jobs: allocation (by the placement loop and by hand) and the GPU-hours they
account for."""

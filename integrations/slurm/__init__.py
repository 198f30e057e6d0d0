"""A Slurm cluster in gpuadmin's view: its nodes, partitions and jobs, read through slurmrestd
and mapped onto the catalogued GPUs. See docs/operations/slurm.md."""

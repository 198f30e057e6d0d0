"""The engines labs already run, seen and driven from gpuadmin: Slurm clusters mirrored through
slurmrestd (``integrations.slurm``); Ray is coming."""

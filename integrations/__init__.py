"""The engines labs already run, seen and driven from gpuadmin: Slurm clusters mirrored through
slurmrestd (``integrations.slurm``), and external Ray clusters that users submit jobs to through
Ray's Jobs API (``integrations.ray``)."""

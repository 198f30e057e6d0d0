"""A job holds exactly what it was given: its cgroup (devices, CPUs, memory, processes) and
the CPUs chosen for it; the executor puts the job's process there at a gate, before the job's
first instruction. Plain Python (no Django); the executor uses it on every node, simulated or
real. docs/administration/isolation.md says what a job can and cannot touch."""

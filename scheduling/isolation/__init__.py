"""A job holds exactly what it was given: its cgroup (devices, CPUs, memory, processes), the
launcher that puts its first process there, and the CPUs chosen for it. Plain Python (no
Django); the executor uses it on every node, simulated or real. The README's "Isolation"
section says what a job can and cannot touch."""

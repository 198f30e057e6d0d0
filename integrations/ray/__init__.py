"""External Ray clusters in gpuadmin: an admin registers a cluster by its dashboard's address,
gpuadmin shows its nodes and GPUs beside the fleet, and users submit jobs to it through Ray's
Jobs REST API (``jobs_api``, plain Python) under gpuadmin's roles, quotas and audit. See
docs/operations/ray.md."""

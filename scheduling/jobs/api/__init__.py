"""The jobs API: jobs, arrays, allocations and tokens under /api/v1/, and the queue, cluster and
orchestrator endpoints of the seed's API."""

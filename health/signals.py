"""What the health app tells the apps above it (scheduling, the Slurm mirror): the one way it
speaks to them."""

from django.dispatch import Signal

# Sent (``sender=HealthEvent``, ``gpu_ids``: primary keys, ``action``: "requeue" or "fail",
# ``reason``: the sentence shown on the job, e.g. "XID 79 on GPU 3 of dgx-01: fallen off the
# bus", ``event_id``) by a recovery policy, on commit. Scheduling stops the jobs holding those
# GPUs (cancel on the agent) and requeues them with their attempt counted, or fails them.
# Idempotent: a job already stopped is left alone.
jobs_on_gpus_must_stop = Signal()

# Sent (``sender=Quarantine``, ``gpu_id``: the GPU's primary key, ``reason``: the sentence the
# GPU's state gives, e.g. "XID 79 ... on GPU 3 of dgx-01") on commit of each GPU a recovery
# policy fences anew. The Slurm mirror asks Slurm to drain the node, where its cluster lets it.
gpu_fenced = Signal()

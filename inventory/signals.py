"""What inventory tells the apps above it has happened (it imports none of them; they connect
receivers here, in their ``AppConfig.ready``). What it asks them is in ``gpuadmin.registry``."""

from django.dispatch import Signal

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys) once a committed change has made
# GPUs schedulable as whole GPUs (``Gpu.objects.schedulable()``, not in MIG mode nor shared
# through MPS) that were not: a node or GPU set back to online/available, a silent node heard
# from again, GPUs that appeared, came back, recovered from an error, left MIG mode or MPS.
# Never sent for a change that rolled back, nor for one that only takes GPUs away.
gpus_became_schedulable = Signal()

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys, ``reason``: a sentence,
# ``actor_name``) once a committed state change took GPUs offline: their running work must stop
# now and be requeued (scheduling requeues the jobs holding them; a job that cannot go back to
# the queue fails with the reason).
gpus_went_offline = Signal()

# Sent (``sender=Node``, ``hostname``, ``scan``: the ``NodeScan`` just published) on a node's
# agent after each live sample is published (the periodic one and the fresh one after a job
# ends); the health app's watcher compares it with the previous one. Agent side only.
sample_taken = Signal()

"""What inventory tells the apps above it, and asks them: the one way it speaks to them (it
imports none of them; they connect receivers here, in their ``AppConfig.ready``)."""

from django.dispatch import Signal

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys) once a committed change has made
# GPUs schedulable as whole GPUs (``Gpu.objects.schedulable()``, not in MIG mode nor shared
# through MPS) that were not: a node or GPU set back to online/available, a silent node heard
# from again, GPUs that appeared, came back, recovered from an error, left MIG mode or MPS.
# Never sent for a change that rolled back, nor for one that only takes GPUs away.
gpus_became_schedulable = Signal()

# Sent (``sender=Gpu``, ``gpu``: the GPU as stored now, ``actor_name``: the system actor
# asking, or None for a person) with ``send`` before a MIG change is sent to the GPU's node,
# once inventory's own checks passed. A receiver returns the sentence that refuses the change
# (scheduling: "it is allocated to job 12", "a MIG re-layout owns it"), or ``None`` to allow it;
# the first refusal wins and nothing is sent. A receiver that raises fails the change.
mig_change_requested = Signal()

# Sent (``sender=Gpu``, ``gpu_ids``: a collection of primary keys) with ``send`` by
# ``inventory.occupancy.Occupancy`` (the fleet pages, the ``free`` filter, the MIG layouts). A
# receiver returns the ``inventory.occupancy.Occupant``s of the GPUs held by work it knows of,
# each naming its GPU and, for a MIG device, its MIG instance (scheduling: the job, its name
# and user of each active allocation), in one query for all of them.
gpu_occupants_requested = Signal()

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys, ``reason``: a sentence,
# ``actor_name``) once a committed state change took GPUs offline: their running work must stop
# now and be requeued (scheduling requeues the jobs holding them; a job that cannot go back to
# the queue fails with the reason).
gpus_went_offline = Signal()

# Sent (``sender=Node``, ``hostname``, ``scan``: the ``NodeScan`` just published) on a node's
# agent after each live sample is published (the periodic one and the fresh one after a job
# ends); the health app's watcher compares it with the previous one. Agent side only.
sample_taken = Signal()

# Sent (``sender``: the page's model, ``page``: "gpu", "node" or "fleet", ``obj``: the Gpu,
# the Node or None, ``request``) with ``send`` by the inventory pages; a receiver returns an
# ``inventory.pages.common.Section`` (or ``None``) that the page renders in ``order``: charts,
# health events, alerts, the allocation history. Kept cheap: the fleet page's live partial
# has a budget of 100 ms at 500 nodes.
page_sections_requested = Signal()

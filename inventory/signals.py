"""What inventory tells the apps above it, and asks them: the one way it speaks to them (it
imports none of them; they connect receivers here, in their ``AppConfig.ready``)."""

from django.dispatch import Signal

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys) once a committed change has made
# GPUs schedulable as whole GPUs (``Gpu.objects.schedulable()``, not in MIG mode) that were
# not: a node or GPU set back to online/available, a silent node heard from again, GPUs that
# appeared, came back, recovered from an error or left MIG mode. Never sent for a change that
# rolled back, nor for one that only takes GPUs away.
gpus_became_schedulable = Signal()

# Sent (``sender=Gpu``, ``gpu``: the GPU as stored now) with ``send`` before a MIG change is
# sent to the GPU's node, once inventory's own checks passed. A receiver returns the sentence
# that refuses the change (scheduling: "it is allocated to job 12"), or ``None`` to allow it;
# the first refusal wins and nothing is sent. A receiver that raises fails the change.
mig_change_requested = Signal()

# Sent (``sender=Gpu``, ``gpu_ids``: a collection of primary keys) with ``send`` by
# ``inventory.occupancy.Occupancy`` (the fleet pages, the ``free`` filter). A receiver returns
# ``{gpu_id: inventory.occupancy.Occupant}`` for the GPUs held by work it knows of
# (scheduling: the job and user of each active allocation), in one query for all of them.
gpu_occupants_requested = Signal()

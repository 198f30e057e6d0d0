"""What inventory tells the apps above it (it imports none of them; they connect here)."""

from django.dispatch import Signal

# Sent (``sender=Gpu``, ``gpu_ids``: sorted primary keys) once a committed change has made
# GPUs schedulable as whole GPUs (``Gpu.objects.schedulable()``, not in MIG mode) that were
# not: a node or GPU set back to online/available, a silent node heard from again, GPUs that
# appeared, came back, recovered from an error or left MIG mode. Never sent for a change that
# rolled back, nor for one that only takes GPUs away.
gpus_became_schedulable = Signal()

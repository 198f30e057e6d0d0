from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, queue and placement"
    name = "scheduling"

    def ready(self) -> None:
        # Inventory knows nothing of jobs: it tells and asks this app through its signals.
        # The fleet dashboard and `?free=` ask who holds a GPU.
        from inventory.signals import (
            gpu_occupants_requested,
            gpus_became_schedulable,
            mig_change_requested,
        )
        from scheduling.receivers import (
            name_occupants,
            refuse_mig_change_under_allocation,
            wake_on_schedulable_gpus,
        )

        gpu_occupants_requested.connect(name_occupants, dispatch_uid="scheduling.name_occupants")
        # A MIG layout never changes under a job that holds the GPU.
        mig_change_requested.connect(
            refuse_mig_change_under_allocation,
            dispatch_uid="scheduling.refuse_mig_change_under_allocation",
        )
        # GPUs that come back are used at once, not at beat's next backstop pass.
        gpus_became_schedulable.connect(
            wake_on_schedulable_gpus, dispatch_uid="scheduling.wake_on_schedulable_gpus"
        )

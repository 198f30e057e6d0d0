from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, placement, reservations"
    name = "scheduling"

    def ready(self) -> None:
        # Inventory knows nothing of jobs; the fleet dashboard asks this app who holds a GPU.
        from inventory.pages import register_occupant_source
        from inventory.services import register_mig_change_guard
        from scheduling.pages import gpu_occupants
        from scheduling.services import refuse_mig_change_under_allocation

        register_occupant_source(gpu_occupants)
        # A MIG layout never changes under a job that holds the GPU.
        register_mig_change_guard(refuse_mig_change_under_allocation)

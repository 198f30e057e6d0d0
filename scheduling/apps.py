from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, queue and placement"
    name = "scheduling"

    def ready(self) -> None:
        # Inventory knows nothing of jobs: it tells this app through its signals and asks it
        # through the registry. The fleet dashboard and `?free=` ask who holds a GPU.
        from gpuadmin import registry
        from gpuadmin.metrics import register
        from health.signals import jobs_on_gpus_must_stop
        from inventory.signals import gpus_became_schedulable, gpus_went_offline
        from scheduling.jobs.pages import gpu_occupants
        from scheduling.metrics import SchedulingCollector
        from scheduling.receivers import (
            refuse_mig_change_of_taken_gpu,
            requeue_jobs_on_offline_gpus,
            stop_jobs_for_health,
            wake_on_schedulable_gpus,
        )
        from scheduling.sections import allocation_section, reservation_section

        registry.gpu_occupants.register(gpu_occupants)
        # A MIG layout never changes under a job that holds the GPU.
        registry.mig_change_vetoes.register(refuse_mig_change_of_taken_gpu)
        # GPUs that come back are used at once, not at beat's next backstop pass.
        gpus_became_schedulable.connect(
            wake_on_schedulable_gpus, dispatch_uid="scheduling.wake_on_schedulable_gpus"
        )
        # Work on failed hardware stops now: requeued (or failed, as the health policy says).
        jobs_on_gpus_must_stop.connect(
            stop_jobs_for_health, dispatch_uid="scheduling.stop_jobs_for_health"
        )
        gpus_went_offline.connect(
            requeue_jobs_on_offline_gpus, dispatch_uid="scheduling.requeue_jobs_on_offline_gpus"
        )
        # /metrics: GPUs held per user and project, the queue and its waits.
        register(SchedulingCollector())
        # The GPU page lists every allocation the GPU has had.
        registry.page_sections.register(allocation_section)
        # A MIG GPU's page shows its re-layouts live, with the admins' form.
        from scheduling.sharing.views import relayout_section

        registry.page_sections.register(relayout_section)
        # The GPU and node pages list their coming reservations, with their week calendars.
        registry.page_sections.register(reservation_section)

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, queue and placement"
    name = "scheduling"

    def ready(self) -> None:
        # Inventory knows nothing of jobs: it tells and asks this app through its signals.
        # The fleet dashboard and `?free=` ask who holds a GPU.
        from gpuadmin.metrics import register
        from health.signals import jobs_on_gpus_must_stop
        from inventory.signals import (
            gpu_occupants_requested,
            gpus_became_schedulable,
            gpus_went_offline,
            mig_change_requested,
            page_sections_requested,
        )
        from scheduling.metrics import SchedulingCollector
        from scheduling.receivers import (
            name_occupants,
            refuse_mig_change_of_taken_gpu,
            requeue_jobs_on_offline_gpus,
            stop_jobs_for_health,
            wake_on_schedulable_gpus,
        )
        from scheduling.sections import allocation_section, reservation_section

        gpu_occupants_requested.connect(name_occupants, dispatch_uid="scheduling.name_occupants")
        # A MIG layout never changes under a job that holds the GPU.
        mig_change_requested.connect(
            refuse_mig_change_of_taken_gpu,
            dispatch_uid="scheduling.refuse_mig_change_of_taken_gpu",
        )
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
        page_sections_requested.connect(
            allocation_section, dispatch_uid="scheduling.allocation_section"
        )
        # A MIG GPU's page shows its re-layouts live, with the admins' form.
        from scheduling.sharing.views import relayout_section

        page_sections_requested.connect(
            relayout_section, dispatch_uid="scheduling.relayout_section"
        )
        # The GPU and node pages list their coming reservations, with their week calendars.
        page_sections_requested.connect(
            reservation_section, dispatch_uid="scheduling.reservation_section"
        )

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, placement, reservations"
    name = "scheduling"

    def ready(self) -> None:
        # Inventory knows nothing of jobs; the fleet dashboard asks this app who holds a GPU.
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from inventory.pages import register_occupant_source
        from inventory.services import register_mig_change_guard
        from inventory.signals import gpus_became_schedulable
        from scheduling.auth import forget_cached_tokens_on_change
        from scheduling.models import ApiToken, Membership
        from scheduling.pages import gpu_occupants
        from scheduling.receivers import wake_on_schedulable_gpus
        from scheduling.services import refuse_mig_change_under_allocation

        register_occupant_source(gpu_occupants)
        # A MIG layout never changes under a job that holds the GPU.
        register_mig_change_guard(refuse_mig_change_under_allocation)
        # GPUs that come back are used at once, not at beat's next backstop pass.
        gpus_became_schedulable.connect(
            wake_on_schedulable_gpus, dispatch_uid="scheduling.wake_on_schedulable_gpus"
        )
        # Cached API tokens are looked up again when a token, a user or a role changes.
        for model in (get_user_model(), Membership, ApiToken):
            for signal in (post_save, post_delete):
                signal.connect(
                    forget_cached_tokens_on_change,
                    sender=model,
                    dispatch_uid=f"scheduling.forget_cached_tokens.{signal is post_save}",
                )

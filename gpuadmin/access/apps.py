from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "gpuadmin.access"
    label = "access"
    verbose_name = "Access: roles and API tokens"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save

        from gpuadmin.access import schema  # noqa: F401  (registers the token auth scheme)
        from gpuadmin.access.models import ApiToken, Membership
        from gpuadmin.access.tokens import forget_cached_tokens_on_change

        # Cached API tokens are looked up again when a token, a user or a role changes.
        for model in (get_user_model(), Membership, ApiToken):
            for signal in (post_save, post_delete):
                signal.connect(
                    forget_cached_tokens_on_change,
                    sender=model,
                    dispatch_uid=f"access.forget_cached_tokens.{signal is post_save}",
                )

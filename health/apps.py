from django.apps import AppConfig


class HealthConfig(AppConfig):
    verbose_name = "Health: telemetry, faults, recovery"
    name = "health"

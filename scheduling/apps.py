from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    verbose_name = "Scheduling: jobs, placement, reservations"
    name = "scheduling"

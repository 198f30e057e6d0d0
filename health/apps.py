from django.apps import AppConfig


class HealthConfig(AppConfig):
    verbose_name = "Health: telemetry, faults, recovery"
    name = "health"

    def ready(self) -> None:
        from gpuadmin import registry
        from gpuadmin.metrics import register
        from health import quarantine, sections, sections_charts
        from health.metrics import HealthCollector
        from inventory.signals import gpus_became_schedulable, gpus_went_offline

        # A person's online or offline of a fenced GPU releases its quarantine at once.
        gpus_became_schedulable.connect(quarantine.gpus_changed, dispatch_uid="health-release")
        gpus_went_offline.connect(quarantine.gpus_changed, dispatch_uid="health-release")
        # The GPU, node and fleet pages: telemetry charts.
        registry.page_sections.register(sections_charts.chart_sections)
        # The GPU and node pages: health events, their 30-day trend, the open quarantine.
        registry.page_sections.register(sections.health_section)
        # noqa: F401 below: admin_alerts and admin_policies register their admin pages.
        from health import admin_alerts, admin_policies, views  # noqa: F401

        registry.page_sections.register(views.alerts_section)
        # /metrics: dcgm-exporter's GPU series and gpuadmin's health series.
        register(HealthCollector())

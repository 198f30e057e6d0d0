from django.apps import AppConfig


class HealthConfig(AppConfig):
    verbose_name = "Health: telemetry, faults, recovery"
    name = "health"

    def ready(self) -> None:
        from gpuadmin.metrics import register
        from health import quarantine, sections, sections_charts
        from health.metrics import HealthCollector
        from inventory.signals import (
            gpus_became_schedulable,
            gpus_went_offline,
            page_sections_requested,
        )

        # A person's online or offline of a fenced GPU releases its quarantine at once.
        gpus_became_schedulable.connect(quarantine.gpus_changed, dispatch_uid="health-release")
        gpus_went_offline.connect(quarantine.gpus_changed, dispatch_uid="health-release")
        # The GPU, node and fleet pages: telemetry charts.
        page_sections_requested.connect(
            sections_charts.chart_sections, dispatch_uid="health-charts"
        )
        # The GPU and node pages: health events, their 30-day trend, the open quarantine.
        page_sections_requested.connect(sections.health_section, dispatch_uid="health-events")
        # noqa: F401 below: admin_alerts and admin_policies register their admin pages.
        from health import admin_alerts, admin_policies, views  # noqa: F401

        page_sections_requested.connect(views.alerts_section, dispatch_uid="health-alerts")
        # /metrics: dcgm-exporter's GPU series and gpuadmin's health series.
        register(HealthCollector())

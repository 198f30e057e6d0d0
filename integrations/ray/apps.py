from django.apps import AppConfig


class RayConfig(AppConfig):
    name = "integrations.ray"
    label = "ray"
    verbose_name = "Ray: external clusters submitted to through Ray's Jobs API"

    def ready(self) -> None:
        from gpuadmin import registry
        from gpuadmin.metrics import register
        from integrations.ray.metrics import RayCollector
        from integrations.ray.sections import fleet_section, jobs_section
        from integrations.ray.usage import gpu_use

        # The fleet page shows each cluster's nodes and GPUs (total and in use); the jobs page
        # the Ray jobs the requester sees.
        registry.page_sections.register(fleet_section)
        registry.page_sections.register(jobs_section)
        # Ray jobs' GPUs count against quotas and in fair share, as allocations do.
        registry.gpu_use.register(gpu_use)
        # /metrics: each cluster's state, nodes, GPUs and jobs, as the poll last read them.
        register(RayCollector())

from django.apps import AppConfig


class SlurmConfig(AppConfig):
    name = "integrations.slurm"
    label = "slurm"
    verbose_name = "Slurm: clusters mirrored through slurmrestd"

    def ready(self) -> None:
        from gpuadmin import registry
        from gpuadmin.metrics import register
        from health.signals import gpu_fenced
        from integrations.slurm import holders, services
        from integrations.slurm.metrics import SlurmCollector
        from integrations.slurm.sections import fleet_section, jobs_section

        # A GPU a Slurm job holds is held by that job on every page, the API and the alert
        # rules (the placement loop keeps off it through the catalog: holders.mark_held).
        registry.gpu_occupants.register(holders.gpu_occupants)
        # The fleet, node and GPU pages show the Slurm nodes and the jobs on their GPUs; the
        # jobs page lists Slurm's jobs beside gpuadmin's.
        registry.page_sections.register(fleet_section)
        registry.page_sections.register(jobs_section)
        # /metrics: each cluster's nodes and jobs per state.
        register(SlurmCollector())
        # A GPU health fenced drains its node in Slurm, where the cluster lets gpuadmin.
        gpu_fenced.connect(services.drain_for_fenced_gpu, dispatch_uid="slurm.drain_for_fenced_gpu")

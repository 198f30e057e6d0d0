from django.apps import AppConfig


class SlurmConfig(AppConfig):
    name = "integrations.slurm"
    label = "slurm"
    verbose_name = "Slurm: clusters mirrored through slurmrestd"

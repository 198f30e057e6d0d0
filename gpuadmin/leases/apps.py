from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "gpuadmin.leases"
    label = "leases"
    verbose_name = "Leases: one holder at a time across processes and machines"

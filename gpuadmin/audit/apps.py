from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "gpuadmin.audit"
    label = "audit"
    verbose_name = "Audit log"

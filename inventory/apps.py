from django.apps import AppConfig


class InventoryConfig(AppConfig):
    verbose_name = "Inventory: nodes, GPUs, MIG, topology"
    name = "inventory"

    def ready(self) -> None:
        from django.utils.module_loading import import_string

        from gpuadmin import registry

        # Inventory's own section of its GPU and node pages: the maintenance form. By name: an
        # import here would put the app config in its models' import cycle, which hides the
        # models' managers from django-stubs.
        registry.page_sections.register(import_string("inventory.maintenance.maintenance_section"))

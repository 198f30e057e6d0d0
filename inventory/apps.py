from django.apps import AppConfig


class InventoryConfig(AppConfig):
    verbose_name = "Inventory: nodes, GPUs, MIG, topology"
    name = "inventory"

    def ready(self) -> None:
        from django.utils.module_loading import import_string

        from inventory.signals import page_sections_requested

        # Inventory's own section of its GPU and node pages: the maintenance form. By name: an
        # import here would put the app config in its models' import cycle, which hides the
        # models' managers from django-stubs.
        page_sections_requested.connect(
            import_string("inventory.maintenance.maintenance_section"),
            dispatch_uid="inventory-maintenance",
        )

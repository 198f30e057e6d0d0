from django.apps import AppConfig


class InventoryConfig(AppConfig):
    verbose_name = "Inventory: nodes, GPUs, MIG, topology"
    name = "inventory"

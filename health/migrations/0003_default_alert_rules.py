"""The shipped alert rules (editable in the admin afterwards). Values are written here, not
imported, so later code changes never rewrite history."""

from django.db import migrations

RULES = [
    {
        "name": "GPU temperature high",
        "kind": "metric",
        "metric": "temperature_c",
        "operator": ">",
        "threshold": 85.0,
        "duration_s": 120,
        "severity": "warning",
        "description": "A GPU above 85 C for 2 minutes.",
    },
    {
        "name": "GPU idle while allocated",
        "kind": "idle_held",
        "metric": "utilization_gpu_pct",
        "operator": "<",
        "threshold": 5.0,
        "duration_s": 1800,
        "severity": "info",
        "description": (
            "An allocated GPU under 5% utilization and 5% memory activity for 30 minutes; its "
            "idle time is counted per user (idle-held GPU-hours)."
        ),
    },
    {
        "name": "GPU health events",
        "kind": "health_event",
        "metric": "",
        "operator": ">=",
        "threshold": None,
        "duration_s": 3600,
        "severity": "warning",
        "description": (
            "Health events of warning severity or worse open an alert per kind (XID) and GPU; "
            "it resolves after an hour without a repeat."
        ),
    },
    {
        "name": "Node unreachable",
        "kind": "node_unreachable",
        "metric": "",
        "operator": ">",
        "threshold": None,
        "duration_s": 0,
        "severity": "critical",
        "description": "A node's agent not heard from within GPUADMIN_HEARTBEAT_GRACE_S.",
    },
    {
        "name": "Foreign process on a GPU",
        "kind": "foreign_process",
        "metric": "",
        "operator": ">",
        "threshold": None,
        "duration_s": 30,
        "severity": "warning",
        "description": "A process on a GPU that no allocation holds, for 30 seconds.",
    },
]


def add_rules(apps, schema_editor):
    AlertRule = apps.get_model("health", "AlertRule")
    for values in RULES:
        AlertRule.objects.get_or_create(name=values["name"], defaults=values)


def remove_rules(apps, schema_editor):
    AlertRule = apps.get_model("health", "AlertRule")
    AlertRule.objects.filter(name__in=[values["name"] for values in RULES]).delete()


class Migration(migrations.Migration):
    dependencies = [("health", "0002_default_policies")]

    operations = [migrations.RunPython(add_rules, remove_rules)]

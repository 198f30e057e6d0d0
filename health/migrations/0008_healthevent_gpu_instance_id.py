"""HealthEvent.gpu_instance_id: the MIG GPU instance an XID was attributed to. Events stored
before it keep the agent's report in ``data``; their instance is copied from there."""

from django.db import migrations, models


def copy_from_reports(apps, schema_editor):
    HealthEvent = apps.get_model("health", "HealthEvent")
    found = HealthEvent.objects.filter(kind="xid", data__data__gpu_instance_id__isnull=False)
    for event in found.only("pk", "data").iterator():
        instance = event.data["data"]["gpu_instance_id"]
        if isinstance(instance, int) and 0 <= instance < 2**15:
            HealthEvent.objects.filter(pk=event.pk).update(gpu_instance_id=instance)


class Migration(migrations.Migration):
    dependencies = [
        ("health", "0007_slurm_event_kinds"),
    ]

    operations = [
        migrations.AddField(
            model_name="healthevent",
            name="gpu_instance_id",
            field=models.PositiveSmallIntegerField(
                blank=True,
                help_text="The MIG GPU instance the driver attributed the XID to (NVML's "
                "gpuInstanceId, the kernel line's GPU-I); empty: the whole GPU.",
                null=True,
                verbose_name="GPU instance ID",
            ),
        ),
        migrations.RunPython(copy_from_reports, migrations.RunPython.noop),
    ]

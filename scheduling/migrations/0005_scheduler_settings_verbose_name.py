from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0004_job_waiting_fields_only_while_queued"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="schedulersettings",
            options={
                "verbose_name": "scheduler settings",
                "verbose_name_plural": "scheduler settings",
            },
        ),
    ]

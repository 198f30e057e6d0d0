from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0002_unix_accounts"),
    ]

    operations = [
        migrations.CreateModel(
            name="NodeCredential",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "node",
                    models.CharField(
                        db_index=True, help_text="The node it speaks for.", max_length=253
                    ),
                ),
                ("salt", models.CharField(editable=False, max_length=64)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "node credential",
                "ordering": ["-pk"],
            },
        ),
    ]

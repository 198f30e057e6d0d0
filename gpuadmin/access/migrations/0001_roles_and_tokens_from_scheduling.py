"""Adopt the roles and API tokens that scheduling 0003 handed over (tables already renamed,
so this only adds them to the state), and their content types, so admin history and granted
permissions follow them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("membership", "apitoken")


def move_content_types(from_label: str, to_label: str):
    def move(apps, schema_editor) -> None:
        ContentType = apps.get_model("contenttypes", "ContentType")
        for model in MODELS:
            if not ContentType.objects.filter(app_label=to_label, model=model).exists():
                ContentType.objects.filter(app_label=from_label, model=model).update(
                    app_label=to_label
                )

    return move


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("scheduling", "0003_move_roles_and_tokens_to_access"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=100)),
                        (
                            "key_prefix",
                            models.CharField(
                                help_text="First characters, to recognise it.", max_length=12
                            ),
                        ),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={"ordering": ["-pk"], "verbose_name": "API token"},
                ),
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "role",
                            models.CharField(
                                choices=[
                                    ("admin", "Admin"),
                                    ("operator", "Operator"),
                                    ("user", "User"),
                                    ("viewer", "Viewer"),
                                ],
                                default="user",
                                max_length=10,
                            ),
                        ),
                        (
                            "user",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="gpuadmin_role",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                ),
            ],
        ),
        migrations.RunPython(
            move_content_types("scheduling", "access"),
            move_content_types("access", "scheduling"),
        ),
    ]

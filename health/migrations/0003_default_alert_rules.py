"""The shipped alert rules (filled in by the alerts work)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("health", "0002_default_policies")]

    operations: list[migrations.operations.base.Operation] = []

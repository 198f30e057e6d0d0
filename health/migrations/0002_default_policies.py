"""The shipped recovery policies (filled in by the policies work)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("health", "0001_health_events_alerts_telemetry")]

    operations: list[migrations.operations.base.Operation] = []

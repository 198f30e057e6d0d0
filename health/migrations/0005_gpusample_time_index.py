"""A BRIN index on the raw samples' time: the minute rollup reads one minute of every GPU by
time alone, which the (gpu_id, at) key cannot serve. Rows arrive in time order, so a BRIN
index fits (48 kB for a full 500-node hour of 7.2 M rows; the rollup went from 1.2-1.5 s to
0.4-0.5 s). Partitions ``health.telemetry`` attaches later get it too."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("health", "0004_quarantine_gpu_state")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX health_gpusample_at_brin ON health_gpusample USING brin (at);",
            "DROP INDEX health_gpusample_at_brin;",
        )
    ]

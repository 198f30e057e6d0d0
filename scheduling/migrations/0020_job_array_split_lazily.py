"""Job arrays split lazily: the array row keeps what its tasks are made with (their fields, their
pool and reservation as its own keys, their dependencies, held or not) and how many of them
are jobs already; the arrays submitted before have every task a job.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0014_gpu_gpu_numa_node'),
        ('scheduling', '0019_job_ending'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='jobarray',
            name='canceled_at',
            field=models.DateTimeField(blank=True, help_text='Canceled: its tasks not made jobs yet never will be.', null=True),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='dependency',
            field=models.TextField(blank=True, help_text='What each task depends on, as Slurm writes it: afterok:12:13.'),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='held',
            field=models.BooleanField(default=False, help_text='Submitted held: its tasks are pending.'),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='pool',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='inventory.pool'),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='reservation',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='scheduling.reservation'),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='split',
            field=models.PositiveIntegerField(default=0, help_text='Its tasks made jobs so far: the first of its indexes, in order.'),
        ),
        migrations.AddField(
            model_name='jobarray',
            name='template',
            field=models.JSONField(blank=True, default=dict, help_text='The other checked Job fields each of its tasks is made with.'),
        ),
        # Every array submitted so far has all its tasks made jobs at its submission.
        migrations.RunSQL(
            "UPDATE scheduling_jobarray SET split = size", reverse_sql=migrations.RunSQL.noop
        ),
        migrations.AddIndex(
            model_name='jobarray',
            index=models.Index(condition=models.Q(('canceled_at__isnull', True), ('split__lt', models.F('size'))), fields=['id'], name='jobarray_unsplit'),
        ),
        migrations.AddConstraint(
            model_name='jobarray',
            constraint=models.CheckConstraint(condition=models.Q(('split__lte', models.F('size'))), name='jobarray_split_le_size'),
        ),
    ]

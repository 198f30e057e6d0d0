"""Tasks of an array canceled one by one before the placement loop made them jobs: their
indexes on the array (``canceled_tasks``), skipped when it splits, so an array whose tasks
still to make are all canceled has none to make (``jobarray_unsplit``)."""

import django.contrib.postgres.fields
import django.db.models.expressions
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0014_gpu_gpu_numa_node'),
        ('scheduling', '0020_job_array_split_lazily'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='jobarray',
            name='jobarray_split_le_size',
        ),
        migrations.RemoveIndex(
            model_name='jobarray',
            name='jobarray_unsplit',
        ),
        migrations.AddField(
            model_name='jobarray',
            name='canceled_tasks',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.PositiveIntegerField(), blank=True, default=list, help_text='Indexes of its tasks canceled before they were made jobs (ascending): never made; the others are made in order around them.', size=None),
        ),
        migrations.AlterField(
            model_name='jobarray',
            name='split',
            field=models.PositiveIntegerField(default=0, help_text='Its tasks made jobs so far: the first of its indexes not canceled, in order.'),
        ),
        migrations.AddIndex(
            model_name='jobarray',
            index=models.Index(condition=models.Q(('canceled_at__isnull', True), ('split__lt', django.db.models.expressions.CombinedExpression(models.F('size'), '-', models.Func(models.F('canceled_tasks'), function='CARDINALITY', output_field=models.IntegerField())))), fields=['id'], name='jobarray_unsplit'),
        ),
        migrations.AddConstraint(
            model_name='jobarray',
            constraint=models.CheckConstraint(condition=models.Q(('split__lte', django.db.models.expressions.CombinedExpression(models.F('size'), '-', models.Func(models.F('canceled_tasks'), function='CARDINALITY', output_field=models.IntegerField())))), name='jobarray_split_le_size'),
        ),
    ]

"""Only a QUEUED job carries the placement loop's word on its wait: jobs that ended (or were
held or placed) while keeping it are cleared, then a constraint keeps it so."""

from django.db import migrations, models

CLEAR_STALE = """
    UPDATE scheduling_job
    SET pending_code = '', pending_reason = '', queue_position = NULL,
        estimated_start_at = NULL, what_if = ''
    WHERE state <> 'queued'
      AND (pending_code <> '' OR pending_reason <> '' OR queue_position IS NOT NULL
           OR estimated_start_at IS NOT NULL OR what_if <> '')
"""


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0003_move_roles_and_tokens_to_access"),
    ]

    operations = [
        # Nothing to restore going back: the cleared values described waits that were over.
        migrations.RunSQL(CLEAR_STALE, reverse_sql=migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("state", "queued"),
                    models.Q(
                        ("estimated_start_at__isnull", True),
                        ("pending_code", ""),
                        ("pending_reason", ""),
                        ("queue_position__isnull", True),
                        ("what_if", ""),
                    ),
                    _connector="OR",
                ),
                name="job_waiting_fields_only_while_queued",
            ),
        ),
    ]

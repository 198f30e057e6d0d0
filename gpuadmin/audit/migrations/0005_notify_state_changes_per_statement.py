"""Announce audited state changes from one trigger call per statement instead of one per row.

The NOTIFYs are those of 0004 (``gpuadmin_state_changes``, the same payload, one per audit row
whose ``after`` has a ``state``, in the rows' order), sent from a statement-level trigger over
the statement's new rows (a transition table): a job array's thousands of ``job.submitted``
rows, inserted by one statement, cost one trigger call and one query, not a PL/pgSQL call
each (two fifths of that INSERT's time).
"""

import importlib

from django.db import migrations

per_row = importlib.import_module("gpuadmin.audit.migrations.0004_notify_state_changes")

CREATE = """
CREATE FUNCTION audit_notify_state_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpuadmin_state_changes', json_build_object(
        'id', changed.id,
        'type', changed.target_type,
        'target', changed.target_id,
        'event', changed.event_type,
        'state', changed.after ->> 'state',
        'before', changed.before ->> 'state',
        'time', changed.time,
        'actor', changed.actor_name,
        'message', left(changed.message, 500)
    )::text)
    FROM new_rows AS changed WHERE changed.after ? 'state' ORDER BY changed.id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER audit_auditevent_notify_state_changes
    AFTER INSERT ON audit_auditevent
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION audit_notify_state_changes();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_auditevent_notify_state_changes ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_notify_state_changes();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_notify_state_changes")]

    operations = [
        migrations.RunSQL(per_row.DROP + CREATE, reverse_sql=DROP + per_row.CREATE),
    ]

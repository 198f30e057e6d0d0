"""Announce every audited state change as it commits: a NOTIFY on the channel
``gpuadmin_state_changes`` for each audit row whose ``after`` has a ``state``.

PostgreSQL delivers a notification only when its transaction commits, in commit order, to every
session that listens: the gRPC server listens on one connection and follows jobs' state
changes from it (``gpuadmin.rpc.events``) instead of reading the table for each client. The
payload is small JSON (the row's id, what it is about and the state; the message cut to 500
characters), well under NOTIFY's 8000 bytes.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION audit_notify_state_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpuadmin_state_changes', json_build_object(
        'id', NEW.id,
        'type', NEW.target_type,
        'target', NEW.target_id,
        'event', NEW.event_type,
        'state', NEW.after ->> 'state',
        'before', NEW.before ->> 'state',
        'time', NEW.time,
        'actor', NEW.actor_name,
        'message', left(NEW.message, 500)
    )::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER audit_auditevent_notify_state_change
    AFTER INSERT ON audit_auditevent
    FOR EACH ROW WHEN (NEW.after ? 'state')
    EXECUTE FUNCTION audit_notify_state_change();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_auditevent_notify_state_change ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_notify_state_change();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_audit_event_channel")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]

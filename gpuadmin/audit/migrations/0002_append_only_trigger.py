"""Make the audit log append-only in the database itself.

A row-level trigger refuses every UPDATE and DELETE on audit_auditevent, whoever issues it (the
ORM, the admin, psql). Rows are only ever inserted, in the transaction of the change they record.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit log is append-only: % refused on audit_auditevent', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER audit_auditevent_append_only
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_audit_event")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]

"""The database also guards MPS shares' memory limits: those of one GPU never add up to more
than its memory, as their percents never pass 100 (the engine's rule, ``placement.mps_fits``;
a manual allocation racing the loop could otherwise over-book it). A share without a limit
takes none."""

from importlib import import_module

from django.db import migrations

GUARD_SQL = """
CREATE OR REPLACE FUNCTION scheduling_allocation_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    clash text;
    given integer;
    memory_given bigint;
    memory_total integer;
BEGIN
    IF NEW.released_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    SELECT memory_total_mib INTO memory_total FROM inventory_gpu WHERE id = NEW.gpu_id FOR UPDATE;
    SELECT kind INTO clash FROM scheduling_allocation
     WHERE gpu_id = NEW.gpu_id AND released_at IS NULL AND id <> NEW.id
       AND (NEW.kind = 'gpu' OR kind <> NEW.kind)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'GPU % is already allocated (%): it cannot also be given as %',
            NEW.gpu_id, clash, NEW.kind
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'allocation_gpu_sharing';
    END IF;
    IF NEW.kind = 'mps' THEN
        SELECT COALESCE(SUM(mps_percent), 0), COALESCE(SUM(mps_memory_mib), 0)
          INTO given, memory_given FROM scheduling_allocation
         WHERE gpu_id = NEW.gpu_id AND released_at IS NULL AND kind = 'mps' AND id <> NEW.id;
        IF given + NEW.mps_percent > 100 THEN
            RAISE EXCEPTION 'GPU % has MPS shares of % percent: % more would pass 100',
                NEW.gpu_id, given, NEW.mps_percent
                USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_mps_at_most_100';
        END IF;
        IF NEW.mps_memory_mib IS NOT NULL
           AND memory_given + NEW.mps_memory_mib > memory_total THEN
            RAISE EXCEPTION 'GPU % has MPS memory limits of % MiB: % MiB more would pass its % MiB',
                NEW.gpu_id, memory_given, NEW.mps_memory_mib, memory_total
                USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_mps_memory_within_gpu';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
DROP TRIGGER scheduling_allocation_guard ON scheduling_allocation;
CREATE TRIGGER scheduling_allocation_guard
    BEFORE INSERT OR UPDATE OF released_at, kind, gpu_id, mps_percent, mps_memory_mib
    ON scheduling_allocation
    FOR EACH ROW EXECUTE FUNCTION scheduling_allocation_guard();
"""

# Migration 0006's guard, as it was.
UNGUARD_SQL = (
    "DROP TRIGGER scheduling_allocation_guard ON scheduling_allocation;\n"
    "DROP FUNCTION scheduling_allocation_guard();\n"
    + import_module("scheduling.migrations.0006_fair_sharing").ALLOCATION_GUARD_SQL
)


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0011_job_usage")]

    operations = [migrations.RunSQL(GUARD_SQL, UNGUARD_SQL)]

"""The test database's backend: gpuadmin's (``gpuadmin.postgres``), with a faster flush.

Every transactional test (the integration, browser and concurrency tests) ends with Django's
flush, which truncates every table. TRUNCATE gives each table, index and telemetry partition
new files: about 1.4 s on a loaded 2-core machine, against 0.1 s for deleting the few rows a
test wrote. The flush deletes them instead, with triggers off for its transaction, so that
neither foreign keys (any order will do: every table is emptied) nor the audit log's
append-only trigger stand in the way. Turning triggers off takes a superuser (as CI's
``postgres`` is); for another role the flush truncates, as Django's does. Content types and
permissions stay: the flush's post_migrate signal would write the same rows back, which takes
twice as long when they are gone.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import operations

from gpuadmin.postgres import base

KEPT = frozenset({"django_content_type", "auth_permission"})


class DatabaseOperations(operations.DatabaseOperations):
    def sql_flush(
        self,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        self.connection.ensure_connection()
        superuser = self.connection.connection.info.parameter_status("is_superuser") == "on"
        if not tables or reset_sequences or not superuser:
            return super().sql_flush(
                style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        # Django runs these in one transaction (execute_sql_flush): SET LOCAL ends with it.
        deletes = [f"DELETE FROM {self.quote_name(table)}" for table in tables if table not in KEPT]
        return ["SET LOCAL session_replication_role = replica", *deletes]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations

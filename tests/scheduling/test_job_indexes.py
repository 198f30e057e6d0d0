"""The job table's partial indexes (a job's array, pool, reservation and preempting job: most
jobs have none, and leave them out) serve the lookups by them all the same: a lookup by a value
(= or IN) implies the column is set."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from scheduling.models import Job


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("lookup", "index"),
    [
        # Either of the array's two (job_array_state, job_array_index_unique), as it costs.
        ({"array_id": 7, "state": "running"}, "job_array_"),
        ({"array_id__in": [7, 8]}, "job_array_"),
        ({"array_id": 7, "array_index": 3}, "job_array_index_unique"),
        ({"pool_id": 7}, "job_pool"),
        ({"reservation_id__in": [7, 8]}, "job_reservation"),
        ({"preempted_by_id": 7}, "job_preempted_by"),
    ],
)
def test_a_lookup_by_a_partial_indexs_column_uses_it(lookup, index):
    query = Job.objects.filter(**lookup).values("pk")
    sql, params = query.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        # The table is empty here: only a plan without a sequential scan shows the index.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Index Scan on {index}" in plan or f"Index Scan using {index}" in plan, plan

"""Job arrays split as Slurm splits them: an array is one row (``JobArray``) until the placement
loop reaches its tasks, and each pass makes the next of them jobs (``split_due``), as many as
the array may use now:

- a capped array (``%N``) keeps at most N + 1 unfinished tasks made: N may run at once, and the
  one more waits in the queue with the array's word (its cap) and stands for the tasks not made
  yet in the lists that collapse an array (``12_[50-1999%50]``);
- an uncapped one keeps ``SPLIT_CHUNK`` waiting tasks made: the next chunk when the loop has
  placed the last one's tasks.

Made at most ``SPLIT_CHUNK`` tasks per array and pass, in the order of its indexes (those
canceled before they were made, ``JobArray.canceled_tasks``, skipped), each as
``submission.submit_job`` would store it (with its dependencies and ``job.submitted``), in one
transaction that holds each array's row locked: two splitters never make the same index (and
``job_array_index_unique`` would refuse it), and what ``control`` does to an array under the
same lock (cancel it or some of its tasks, hold or release it) is seen whole by the next
split. A canceled array makes none any more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.db.models.query import QuerySet

from gpuadmin.audit.services import record_each
from scheduling.jobs import dependencies, queries, slurm
from scheduling.jobs.models import CANCELED_TASKS
from scheduling.jobs.submission import submitted_after
from scheduling.models import TERMINAL_STATES, Job, JobArray

# Tasks made per array and pass, at most; an uncapped array keeps as many waiting.
SPLIT_CHUNK = 500


def unsplit_arrays() -> QuerySet[JobArray]:
    """The arrays with tasks still to make jobs (partial index ``jobarray_unsplit``)."""
    return JobArray.objects.filter(split__lt=F("size") - CANCELED_TASKS, canceled_at__isnull=True)


def split_due(fence: Callable[[], AbstractContextManager[object]] = nullcontext) -> int:
    """Make jobs of the tasks each array may use now (see the module's rules), in one
    transaction, ``fence`` entered around it (the placement loop's lease,
    ``loop.passes.fenced``); the number made. One query when no array has tasks to make."""
    if not unsplit_arrays().exists():
        return 0
    with fence(), transaction.atomic():
        # Locked first, counted after: a count read in the locking statement would be as old
        # as its snapshot, a splitter that waited for the lock would not see the tasks the
        # one before it made.
        arrays = list(
            unsplit_arrays()
            .select_for_update(of=("self",))
            .select_related("owner", "pool")
            .order_by("pk")
        )
        if not arrays:
            return 0
        counts = {
            row["array_id"]: row
            for row in Job.objects.filter(array_id__in=[array.pk for array in arrays])
            .exclude(state__in=TERMINAL_STATES)
            .order_by()
            .values("array_id")
            .annotate(
                unfinished=Count("pk"),
                waiting=Count("pk", filter=Q(state__in=queries.WAITING_STATES)),
            )
        }
        made = 0
        for array in arrays:
            count = counts.get(array.pk, {"unfinished": 0, "waiting": 0})
            if array.max_running is None:
                room = SPLIT_CHUNK - count["waiting"]
            else:
                room = array.max_running + 1 - count["unfinished"]
            made += split(array, min(room, SPLIT_CHUNK))
        return made


def split(array: JobArray, most: int) -> int:
    """Make jobs of ``array``'s next ``most`` tasks at most (in the caller's transaction,
    ``array`` locked and current); the number made."""
    indexes = queries.unsplit_indexes(array)[: max(most, 0)]
    if not indexes:
        return 0
    task = Job(
        owner=array.owner,
        state=array.unsplit_state,
        array=array,
        pool=array.pool,
        reservation_id=array.reservation_id,
        submitted_at=array.submitted_at,  # it waits since the array's submission
        **array.template,
    )
    task_ids = _insert_tasks(task, indexes)
    needs = slurm.parse_dependency(array.dependency) if array.dependency else []
    dependencies.store(task_ids, [(kind, Job(pk=job_id)) for kind, job_id in needs])
    record_each(
        "job.submitted",
        _task_changes(task, task_ids, indexes, array.dependency),
        target_type=Job._meta.label_lower,
        actor=array.owner,
        message=f"made a job of array {array.pk} by the placement loop",
    )
    array.split += len(indexes)
    array.save(update_fields=["split"])
    return len(indexes)


def _task_changes(
    task: Job, task_ids: Sequence[int], indexes: Sequence[int], dependency: str
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each task's (id, text, ``job.submitted`` after), ``task`` standing for each in turn."""
    after = submitted_after(task, dependency)
    for task.pk, task.array_index in zip(task_ids, indexes, strict=True):
        yield task.pk, str(task), {**after, "array_index": task.array_index}


def _insert_tasks(task: Job, indexes: Sequence[int]) -> list[int]:
    """Store ``task`` (unsaved, its ``submitted_at`` set) once per index as its
    ``array_index``, in one ``INSERT ... SELECT`` over ``unnest()`` of the indexes: a
    parameter per column, however many tasks (a multi-row ``VALUES`` takes one per column
    and row, and PostgreSQL at most 65,535 in all). The ids, in the order of ``indexes``."""
    meta = Job._meta
    columns = [f for f in meta.concrete_fields if not f.primary_key and f.name != "array_index"]
    quote = connection.ops.quote_name
    values = [
        f.get_db_prep_save(
            task.submitted_at if f.name == "submitted_at" else f.pre_save(task, add=True),
            connection,
        )
        for f in columns
    ]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} "
        f"({', '.join(quote(f.column) for f in columns)}, {quote('array_index')}) "
        f"SELECT {', '.join(f'%s::{f.db_type(connection)}' for f in columns)}, task.index "
        "FROM unnest(%b::integer[]) WITH ORDINALITY AS task(index, n) ORDER BY task.n "
        f"RETURNING {quote(meta.pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, list(indexes)])
        return [row[0] for row in cursor.fetchall()]

"""Telemetry history: agents' samples from the Redis stream into PostgreSQL, minute rollups,
and the partitions both live in.

Agents add one stream entry per sample (``inventory.live.publish``: fields ``node``, ``at``
and ``gpus``, a JSON object of ``{gpu uuid: sample}``). ``ingest`` reads the stream through a
consumer group, so several central workers share it and an entry is acknowledged only once its
rows are committed; entries a dead worker had read are claimed again after
``CLAIM_IDLE_MS``. Rows go in with ``COPY`` through a temporary table, so a sample ingested
twice (a claimed entry, an agent's retry) is dropped by the primary key instead of failing
the batch.

``maintain`` (every minute) creates the coming partitions, rolls finished minutes up and drops
what retention no longer keeps. All times are UTC: an hourly raw partition is named
``health_gpusample_pYYYYMMDDHH``, a daily rollup partition ``health_gpurollup_pYYYYMMDD``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from gpuadmin.redis_client import client
from inventory.live import LiveSample
from inventory.models import Gpu

logger = logging.getLogger("gpuadmin.health.telemetry")

GROUP = "gpuadmin-ingest"
# An entry read but not acknowledged for this long (its worker died, or its batch failed) is
# claimed by the next ingest run.
CLAIM_IDLE_MS = 60_000
# Consumers (one per worker process) with nothing pending that have been idle this long are
# removed from the group, so restarts do not pile them up.
CONSUMER_FORGET_MS = 3_600_000
# Serialises partition DDL and rollups across workers ("gpuadmin" + 1).
MAINTENANCE_LOCK_ID = 0x67707561_646D696F

RAW_TABLE = "health_gpusample"
ROLLUP_TABLE = "health_gpurollup"
FLEET_TABLE = "health_fleetrollup"
INCOMING_TABLE = "health_gpusample_incoming"

# (column, how a sample's value is coerced); the sample's key is the column's name except
# where SAMPLE_KEYS says otherwise.
COLUMNS: tuple[tuple[str, type], ...] = (
    ("utilization_gpu_pct", int),
    ("utilization_memory_pct", int),
    ("memory_used_mib", int),
    ("temperature_c", int),
    ("memory_temperature_c", int),
    ("power_w", float),
    ("energy_mj", int),
    ("sm_clock_mhz", int),
    ("mem_clock_mhz", int),
    ("fan_pct", int),
    ("pcie_tx_kbps", int),
    ("pcie_rx_kbps", int),
    ("ecc_corrected", int),
    ("ecc_uncorrected", int),
)
ROW_COLUMNS = (
    "gpu_id",
    "at",
    *(name for name, _ in COLUMNS),
    "clock_event_reasons",
    "processes",
    "mig",
)


def consumer_name() -> str:
    """This process's name in the consumer group."""
    return f"{socket.gethostname()}-{os.getpid()}"


def stats_key() -> str:
    """Redis hash of counters: samples ``ingested``, samples of ``unknown`` GPUs, ``malformed``
    samples or entries, entries ``trimmed`` from the stream before they were ingested."""
    return f"{settings.GPUADMIN_SAMPLE_STREAM}:stats"


def stats() -> dict[str, int]:
    """The ingest counters since the stream was created (all processes together)."""
    found = cast("dict[bytes, bytes]", client().hgetall(stats_key()))
    return {key.decode(): int(value) for key, value in found.items()}


# ---------------------------------------------------------------------------------------------
# Ingest


@dataclass
class Batch:
    rows: list[tuple[Any, ...]]
    unknown: int = 0
    malformed: int = 0
    trimmed: int = 0


# GPU uuid -> Gpu id, filled on a miss (GPUs are never renumbered; a removed one's rows stay
# until retention drops them).
_gpu_ids: dict[str, int] = {}
# The hour whose partitions this process last made sure of.
_partitions_hour: datetime | None = None


def ingest(
    max_entries: int = 20_000, *, batch: int = 1_000, claim_idle_ms: int = CLAIM_IDLE_MS
) -> int:
    """Copy the stream's new entries (at most ``max_entries``) into ``health_gpusample``,
    ``batch`` entries per transaction, acknowledging each batch once committed; entries pending
    for longer than ``claim_idle_ms`` are taken over first. Returns once a read comes back short
    (caught up), so a run ends even while agents keep adding. Returns the rows written
    (duplicates not counted). A batch that fails raises and stays pending, to be claimed
    again."""
    redis_client = client()
    stream = settings.GPUADMIN_SAMPLE_STREAM
    consumer = consumer_name()
    _ensure_group(redis_client, stream)
    _ensure_current_partitions()
    written = 0
    claimed = _claim(redis_client, stream, consumer, claim_idle_ms, max_entries)
    for start in range(0, len(claimed), batch):
        written += _absorb(redis_client, stream, claimed[start : start + batch])
    read = len(claimed)
    while read < max_entries:
        reply = cast(
            "list[Any]",
            redis_client.xreadgroup(
                GROUP, consumer, {stream: ">"}, count=min(batch, max_entries - read)
            ),
        )
        entries = reply[0][1] if reply else []
        if entries:
            written += _absorb(redis_client, stream, entries)
            read += len(entries)
        if len(entries) < batch:  # caught up: what arrives meanwhile is the next run's
            break
    _trim_absorbed(redis_client, stream)
    return written


def _trim_absorbed(redis_client: redis.Redis, stream: str) -> None:
    """Drop the entries the ingest is done with, so that the stream holds seconds of samples
    (unread or pending), not ``GPUADMIN_SAMPLE_STREAM_MAX`` entries of history (that bound is
    for an ingest that stopped): below the oldest pending entry, or else the last one read.
    Approximate (whole radix-tree nodes), as cheap as XADD's own trimming."""
    pending = cast("dict[str, Any]", redis_client.xpending(stream, GROUP))
    oldest = pending["min"] if pending["pending"] else None
    if oldest is None:
        groups = cast("list[dict[str, Any]]", redis_client.xinfo_groups(stream))
        oldest = next(
            (group["last-delivered-id"] for group in groups if _text(group["name"]) == GROUP),
            None,
        )
    if oldest is not None:
        redis_client.xtrim(stream, minid=oldest, approximate=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _claim(
    redis_client: redis.Redis, stream: str, consumer: str, idle_ms: int, count: int
) -> list[Any]:
    """Take over the entries pending longer than ``idle_ms``. One trimmed from the stream
    meanwhile comes back with no fields (Redis 7 drops those from the pending list itself;
    Redis 6.2 would return them with no id, hence ids first)."""
    ids = cast(
        "list[bytes]",
        redis_client.xautoclaim(
            stream, GROUP, consumer, min_idle_time=idle_ms, start_id="0-0", count=count, justid=True
        ),
    )
    if not ids:
        return []
    pipe = redis_client.pipeline()
    for entry_id in ids:
        pipe.xrange(stream, entry_id, entry_id)
    return [
        found[0] if found else (entry_id, {})
        for entry_id, found in zip(ids, pipe.execute(), strict=True)
    ]


def _ensure_group(redis_client: redis.Redis, stream: str) -> None:
    try:
        redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _ensure_current_partitions() -> None:
    """Once an hour per process: the ingest path creates its own partitions, so a fresh
    install (or a stopped maintenance task) does not write to the DEFAULT partition for long."""
    global _partitions_hour
    hour = _floor_hour(timezone.now())
    if hour != _partitions_hour:
        ensure_partitions(hour)
        _partitions_hour = hour


def _absorb(redis_client: redis.Redis, stream: str, entries: Sequence[Any]) -> int:
    parsed = _rows(entries)
    written = _write(parsed.rows) if parsed.rows else 0
    redis_client.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
    _count(
        redis_client,
        ingested=written,
        unknown=parsed.unknown,
        malformed=parsed.malformed,
        trimmed=parsed.trimmed,
    )
    return written


def _count(redis_client: redis.Redis, **counts: int) -> None:
    pipe = redis_client.pipeline()
    for name, count in counts.items():
        if count:
            pipe.hincrby(stats_key(), name, count)
    pipe.execute()
    if skipped := {name: count for name, count in counts.items() if count and name != "ingested"}:
        logger.warning("samples skipped: %s", skipped)


def _rows(entries: Sequence[Any]) -> Batch:
    """The rows of these stream entries; samples of GPUs not in the catalog are counted in
    ``unknown``, unreadable entries or samples in ``malformed``, entries with no fields (trimmed
    while pending) in ``trimmed``."""
    result = Batch(rows=[])
    samples: list[tuple[datetime, str, LiveSample]] = []
    for _, fields in entries:
        if not fields:
            result.trimmed += 1
            continue
        try:
            at = datetime.fromtimestamp(float(fields[b"at"]), UTC)
            gpus = json.loads(fields[b"gpus"])
            samples.extend((at, str(uuid), values) for uuid, values in gpus.items())
        except (KeyError, ValueError, TypeError, AttributeError, OverflowError):
            result.malformed += 1
    missing = {uuid for _, uuid, _ in samples if uuid not in _gpu_ids}
    if missing:
        _gpu_ids.update(Gpu.objects.filter(uuid__in=missing).values_list("uuid", "id"))
    for at, uuid, values in samples:
        gpu_id = _gpu_ids.get(uuid)
        if gpu_id is None:
            result.unknown += 1
            continue
        try:
            result.rows.append(_row(gpu_id, at, values))
        except (ValueError, TypeError, AttributeError, OverflowError):
            result.malformed += 1
    return result


def _row(gpu_id: int, at: datetime, values: LiveSample) -> tuple[Any, ...]:
    by_name: Mapping[str, Any] = values  # COLUMNS name the fields

    def number(name: str, kind: type) -> Any:
        value = by_name.get(name)
        return None if value is None else kind(round(value) if kind is int else value)

    mig = values.get("mig")  # a GPU not in MIG mode has none: NULL, not an empty list
    return (
        gpu_id,
        at,
        *(number(name, kind) for name, kind in COLUMNS),
        [str(reason)[:32] for reason in values.get("throttle_reasons") or ()],
        int(values.get("processes") or 0),
        Jsonb(mig) if mig else None,
    )


def _write(rows: list[tuple[Any, ...]]) -> int:
    """COPY the rows into a temporary table, then insert what is new."""
    columns = ", ".join(ROW_COLUMNS)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {INCOMING_TABLE} "
            f"(LIKE {RAW_TABLE}) ON COMMIT DELETE ROWS"
        )
        cursor.execute(f"TRUNCATE {INCOMING_TABLE}")
        with cursor.cursor.copy(f"COPY {INCOMING_TABLE} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO {RAW_TABLE} ({columns}) SELECT {columns} FROM {INCOMING_TABLE} "
            "ON CONFLICT DO NOTHING"
        )
        return cursor.rowcount


def forget_idle_consumers() -> int:
    """Remove consumers (workers long gone) that have nothing pending. The number removed."""
    redis_client = client()
    stream = settings.GPUADMIN_SAMPLE_STREAM
    try:
        consumers = cast("list[dict[str, Any]]", redis_client.xinfo_consumers(stream, GROUP))
    except redis.ResponseError:  # no stream or group yet
        return 0
    removed = 0
    for found in consumers:
        if found["pending"] == 0 and found["idle"] > CONSUMER_FORGET_MS:
            redis_client.xgroup_delconsumer(stream, GROUP, found["name"])
            removed += 1
    return removed


# ---------------------------------------------------------------------------------------------
# Partitions, retention and rollups


@dataclass(frozen=True)
class Partitioned:
    """A range-partitioned table: its partitions' size and how their names encode them."""

    table: str
    column: str
    step: timedelta
    name_format: str  # strftime of the partition's start
    name_pattern: re.Pattern[str]

    def name(self, start: datetime) -> str:
        return f"{self.table}_p{start.strftime(self.name_format)}"

    def start_of(self, name: str) -> datetime | None:
        match = self.name_pattern.fullmatch(name)
        if match is None:
            return None
        return datetime.strptime(match[1], self.name_format).replace(tzinfo=UTC)


RAW = Partitioned(
    RAW_TABLE, "at", timedelta(hours=1), "%Y%m%d%H", re.compile(rf"{RAW_TABLE}_p(\d{{10}})")
)
ROLLUP = Partitioned(
    ROLLUP_TABLE, "minute", timedelta(days=1), "%Y%m%d", re.compile(rf"{ROLLUP_TABLE}_p(\d{{8}})")
)


@contextmanager
def _maintenance() -> Iterator[Any]:
    """A transaction holding the maintenance lock, and its cursor."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_ID])
        yield cursor


def _floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _floor_minute(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _literal(moment: datetime) -> str:
    return f"'{moment.astimezone(UTC).isoformat()}'"


def _partitions(cursor: Any, kind: Partitioned) -> dict[str, datetime]:
    """The table's partitions named by this module, with their starts."""
    cursor.execute(
        "SELECT child.relname FROM pg_inherits "
        "JOIN pg_class child ON child.oid = pg_inherits.inhrelid "
        "WHERE pg_inherits.inhparent = %s::regclass",
        [kind.table],
    )
    found = {}
    for (name,) in cursor.fetchall():
        start = kind.start_of(name)
        if start is not None:
            found[name] = start
    return found


def ensure_partitions(now: datetime | None = None) -> list[str]:
    """Create the hourly raw partitions from the hour before ``now`` to 3 hours after, and the
    daily rollup partitions for today and the 2 days after; rows the DEFAULT partition holds
    in a new partition's range move into it. Idempotent. The names created."""
    now = now or timezone.now()
    hour = _floor_hour(now)
    day = hour.replace(hour=0)
    wanted = [(RAW, hour + RAW.step * offset) for offset in range(-1, 4)]
    wanted += [(ROLLUP, day + ROLLUP.step * offset) for offset in range(3)]
    created = []
    with _maintenance() as cursor:
        existing = set(_partitions(cursor, RAW)) | set(_partitions(cursor, ROLLUP))
        for kind, start in wanted:
            name = kind.name(start)
            if name not in existing:
                _create_partition(cursor, kind, name, start)
                created.append(name)
    if created:
        logger.info("telemetry partitions created: %s", ", ".join(created))
    return created


def _create_partition(cursor: Any, kind: Partitioned, name: str, start: datetime) -> None:
    """A partition cannot be attached while the DEFAULT partition holds rows in its range:
    with the DEFAULT locked, those rows move into the new table, which is then attached (and
    gets the parent's indexes)."""
    default = f"{kind.table}_default"
    low, high = _literal(start), _literal(start + kind.step)
    cursor.execute(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(
        f"CREATE TABLE {name} (LIKE {kind.table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    cursor.execute(
        f"WITH moved AS (DELETE FROM {default} WHERE {kind.column} >= {low} "
        f"AND {kind.column} < {high} RETURNING *) INSERT INTO {name} SELECT * FROM moved"
    )
    if cursor.rowcount:
        logger.info("moved %d rows from %s into %s", cursor.rowcount, default, name)
    cursor.execute(
        f"ALTER TABLE {kind.table} ATTACH PARTITION {name} FOR VALUES FROM ({low}) TO ({high})"
    )


def prune(now: datetime | None = None) -> list[str]:
    """Drop the raw partitions that ended more than GPUADMIN_RAW_RETENTION_H ago and the
    rollup partitions that ended more than GPUADMIN_ROLLUP_RETENTION_D ago; delete the rows
    past those cut-offs from the DEFAULT partitions and the fleet rollup. The names dropped."""
    now = now or timezone.now()
    cutoffs = (
        (RAW, now - timedelta(hours=settings.GPUADMIN_RAW_RETENTION_H)),
        (ROLLUP, now - timedelta(days=settings.GPUADMIN_ROLLUP_RETENTION_D)),
    )
    dropped = []
    with _maintenance() as cursor:
        for kind, cutoff in cutoffs:
            for name, start in sorted(_partitions(cursor, kind).items()):
                if start + kind.step <= cutoff:
                    cursor.execute(f"DROP TABLE {name}")
                    dropped.append(name)
            cursor.execute(
                f"DELETE FROM {kind.table}_default WHERE {kind.column} < {_literal(cutoff)}"
            )
        cursor.execute(f"DELETE FROM {FLEET_TABLE} WHERE minute < {_literal(cutoffs[1][1])}")
    if dropped:
        logger.info("telemetry partitions dropped: %s", ", ".join(dropped))
    return dropped


def cluster_finished_day(now: datetime | None = None) -> str | None:
    """Rewrite the oldest finished rollup partition not yet clustered in (gpu_id, minute)
    order, and return its name. The rollup writes every GPU minute by minute, so a GPU's week
    lies on 10,080 pages until then, and a chart's first read of it is several times slower
    (bench/history.py). A day is finished an hour after it ends (late minutes are rolled up
    within seconds); one partition per run, as CLUSTER locks it while it rewrites it."""
    now = now or timezone.now()
    with _maintenance() as cursor:
        for name, start in sorted(_partitions(cursor, ROLLUP).items()):
            if start + ROLLUP.step + timedelta(hours=1) > now:
                continue
            cursor.execute(
                "SELECT indexrelid::regclass::text, indisclustered FROM pg_index "
                "WHERE indrelid = %s::regclass AND indisprimary",
                [name],
            )
            key, clustered = cursor.fetchone()
            if not clustered:
                cursor.execute(f"CLUSTER {name} USING {key}")
                logger.info("telemetry partition clustered: %s", name)
                return name
    return None


def settle_delay() -> timedelta:
    """How long after a minute ends its samples are taken to be in: an agent's interval plus
    an ingest run's, twice over."""
    return timedelta(
        seconds=2 * (settings.GPUADMIN_SAMPLE_INTERVAL_S + settings.GPUADMIN_INGEST_INTERVAL_S)
    )


ROLLUP_SQL = f"""
WITH samples AS (
    SELECT gpu_id, at, date_trunc('minute', at) AS minute, utilization_gpu_pct,
        memory_used_mib, temperature_c, power_w,
        energy_mj - lag(energy_mj) OVER (PARTITION BY gpu_id ORDER BY at) AS energy_delta
    FROM {RAW_TABLE}
    WHERE at >= %(lookback)s AND at < %(end)s
), gpus AS (
    INSERT INTO {ROLLUP_TABLE} AS rollup (
        gpu_id, minute, samples, utilization_min, utilization_avg, utilization_max,
        memory_used_min, memory_used_avg, memory_used_max, temperature_min, temperature_avg,
        temperature_max, power_min, power_avg, power_max, energy_mj
    )
    SELECT gpu_id, minute, count(*),
        min(utilization_gpu_pct), avg(utilization_gpu_pct), max(utilization_gpu_pct),
        min(memory_used_mib), avg(memory_used_mib), max(memory_used_mib),
        min(temperature_c), avg(temperature_c), max(temperature_c),
        min(power_w), avg(power_w), max(power_w),
        sum(energy_delta) FILTER (WHERE energy_delta >= 0)
    FROM samples
    WHERE at >= %(start)s
    GROUP BY gpu_id, minute
    ON CONFLICT (gpu_id, minute) DO UPDATE SET
        samples = EXCLUDED.samples,
        utilization_min = EXCLUDED.utilization_min,
        utilization_avg = EXCLUDED.utilization_avg,
        utilization_max = EXCLUDED.utilization_max,
        memory_used_min = EXCLUDED.memory_used_min,
        memory_used_avg = EXCLUDED.memory_used_avg,
        memory_used_max = EXCLUDED.memory_used_max,
        temperature_min = EXCLUDED.temperature_min,
        temperature_avg = EXCLUDED.temperature_avg,
        temperature_max = EXCLUDED.temperature_max,
        power_min = EXCLUDED.power_min,
        power_avg = EXCLUDED.power_avg,
        power_max = EXCLUDED.power_max,
        energy_mj = EXCLUDED.energy_mj
    RETURNING minute, utilization_avg, memory_used_avg, power_avg
)
INSERT INTO {FLEET_TABLE} AS fleet (minute, gpus, utilization_avg, memory_used_mib, power_w)
SELECT minutes.minute, count(gpus.minute), avg(gpus.utilization_avg),
    round(sum(gpus.memory_used_avg)), sum(gpus.power_avg)
FROM generate_series(%(start)s, %(last)s, interval '1 minute') AS minutes (minute)
LEFT JOIN gpus ON gpus.minute = minutes.minute
GROUP BY minutes.minute
ON CONFLICT (minute) DO UPDATE SET
    gpus = EXCLUDED.gpus,
    utilization_avg = EXCLUDED.utilization_avg,
    memory_used_mib = EXCLUDED.memory_used_mib,
    power_w = EXCLUDED.power_w
"""


def rollup(now: datetime | None = None) -> int:
    """Roll up every finished minute (``settle_delay`` past its end) after the last one rolled
    up, back to at most the raw retention: one GpuRollup row per GPU with samples in the minute
    (min/avg/max, energy used) and one FleetRollup row per minute (0 GPUs when none reported),
    which also marks the minute done. The number of minutes rolled up."""
    now = now or timezone.now()
    end = _floor_minute(now - settle_delay())
    oldest = _floor_minute(now - timedelta(hours=settings.GPUADMIN_RAW_RETENTION_H))
    with _maintenance() as cursor:
        cursor.execute(f"SELECT max(minute) FROM {FLEET_TABLE}")
        (last,) = cursor.fetchone()
        start = max(oldest, last + timedelta(minutes=1)) if last else oldest
        if start >= end:
            return 0
        # The energy counter's delta of a minute's first sample needs the sample before it.
        lookback = start - timedelta(seconds=5 * settings.GPUADMIN_SAMPLE_INTERVAL_S)
        cursor.execute(
            ROLLUP_SQL,
            {"lookback": lookback, "start": start, "end": end, "last": end - timedelta(minutes=1)},
        )
    return (end - start) // timedelta(minutes=1)


@dataclass
class Maintained:
    created: list[str]
    minutes: int
    dropped: list[str]
    consumers_forgotten: int
    clustered: str | None


def maintain(now: datetime | None = None) -> Maintained:
    """The minute task: coming partitions, finished minutes' rollups, retention."""
    now = now or timezone.now()
    return Maintained(
        created=ensure_partitions(now),
        minutes=rollup(now),
        dropped=prune(now),
        consumers_forgotten=forget_idle_consumers(),
        clustered=cluster_finished_day(now),
    )

"""``gpuadmin reserve``, ``quota``, ``alerts``, ``audit``, ``login`` and ``logout``: the
operator's and user's verbs over the HTTP API (``gpuadmin.client``), standard library only.
Their output conventions and examples are in docs/operations/cli.md.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import socket
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO
from urllib.parse import quote

from gpuadmin.client import (
    DEFAULT_URL,
    EXIT_FAILED,
    EXIT_USAGE,
    GPU_UUID,
    Api,
    ApiError,
    Credentials,
    one_line,
    run_verb,
    same_server,
)
from gpuadmin.english import plural
from gpuadmin.terminal import Column, add_json_flag, print_facts, print_json, print_rows

# --------------------------------------------------------------------------- times

# A duration as people write one: 90s, 15m (or 15min), 2h, 2d, 1w, or parts in a row (1h30m).
_DURATION_PART = re.compile(r"(\d{1,6})(w|d|h|min|m|s)")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "min": 60, "m": 60, "s": 1}
_RELATIVE = re.compile(r"(?:now)?(?P<sign>[+-]?)(?P<duration>.+)")
TIME_HELP = "ISO 8601 (no offset: your local time), now, +2h, now+30m"
MAX_DURATION = timedelta(days=10000)  # far past any window the server takes, and in range


def duration(text: str) -> timedelta:
    """``2h``, ``90m``, ``1h30m``, ``2d``, ``1w`` as a timedelta (argparse's type)."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number and a unit (s, m, h, d, w), e.g. 2h or 1h30m"
        )
    total = timedelta(seconds=sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts))
    if total > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_DURATION.days} days")
    return total


def moment(text: str, now: datetime, *, ago: bool = False) -> datetime:
    """A time: ISO 8601 (a date, or a date and time; without an offset it is this machine's
    local time), ``now``, or ``now`` moved by a duration (``+2h``, ``now-1d``). A bare duration
    is that long from now: ahead, or back when ``ago`` (``--since 2d``)."""
    if text == "now":
        return now
    try:
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.astimezone()  # naive: this machine's zone
    except ValueError:
        pass
    except (OverflowError, OSError):  # a naive time this machine's clock cannot place
        raise argparse.ArgumentTypeError(f"{text!r}: out of range") from None
    relative = _RELATIVE.fullmatch(text)
    try:
        if relative is None:
            raise argparse.ArgumentTypeError("")
        step = duration(relative["duration"])
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: {TIME_HELP}") from None
    backwards = relative["sign"] == "-" or (ago and not relative["sign"])
    return now - step if backwards else now + step


def _time(text: str) -> str:
    """A time as argparse checks it; each verb reads its times against one ``now``."""
    moment(text, datetime.now(UTC))
    return text


def local_time(value: str | None, seconds: bool = False) -> str:
    """An API time (ISO 8601) in this machine's time zone, to the minute (or second)."""
    if not value:
        return ""
    shape = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return datetime.fromisoformat(value).astimezone().strftime(shape)


def _window(start: str, end: str) -> str:
    """``2026-12-06 07:00 to 09:00`` (the end's date only when it is another day)."""
    first, last = local_time(start), local_time(end)
    return f"{first} to {last[11:] if first[:10] == last[:10] else last}"


# --------------------------------------------------------------------------- lists


def _page(api: Api, path: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    """The first ``limit`` results of a list endpoint; how many more there are on stderr."""
    page = api.call("GET", path, limit=limit, **filters)
    if page["count"] > len(page["results"]):
        sys.stderr.write(f"({len(page['results'])} of {page['count']}; --limit N for more)\n")
    return page["results"]


# --------------------------------------------------------------------------- reserve

RESERVATION_STATES = ("requested", "approved", "rejected", "canceled", "released", "ended")
OPEN_RESERVATION_STATES = ("requested", "approved")


def _where(reservation: Mapping[str, Any]) -> str:
    """What a reservation asked for besides a count: node, named GPUs, model, pool."""
    parts = [
        reservation["node"],
        reservation["requested_gpus"] and f"{len(reservation['requested_gpus'])} named GPUs",
        reservation["gpu_model"],
        reservation["pool"] and f"pool {reservation['pool']}",
    ]
    return ", ".join(part for part in parts if part) or "any node"


RESERVATION_COLUMNS = (
    Column("ID", lambda r: r["id"], align="right"),
    Column("STATE", lambda r: r["state"], coloured=True),
    Column("OWNER", lambda r: r["owner"]),
    Column("GPUS", lambda r: r["gpu_count"], align="right"),
    Column("WHERE", _where),
    Column("START", lambda r: local_time(r["start"])),
    Column("END", lambda r: local_time(r["end"])),
    Column("NOTE", lambda r: " | ".join(text for text in (r["note"], r["message"]) if text)),
)


def _said(reservation: Mapping[str, Any]) -> str:
    """``reservation 4 approved: 2 GPUs on dgx-01, 2026-12-06 07:00 to 09:00``."""
    return (
        f"reservation {reservation['id']} {reservation['state']}: "
        f"{plural(reservation['gpu_count'], 'GPU')} ({_where(reservation)}), "
        f"{_window(reservation['start'], reservation['end'])}"
    )


def cmd_reserve_create(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    now = datetime.now(UTC)
    start = moment(args.start, now) if args.start else now
    try:
        end = moment(args.end, now) if args.end else start + args.duration
    except OverflowError:
        raise ApiError(None, "the end would be past the year 9999") from None
    body = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "gpu_count": args.gpus,
        "node": args.node,
        "gpus": args.gpu or None,
        "gpu_model": args.model,
        "pool": args.pool,
        "project": args.project,
        "note": args.note,
    }
    created = api.call(
        "POST", "/api/v1/reservations/", {k: v for k, v in body.items() if v is not None}
    )
    if args.json:
        print_json(out, created)
        return 0
    print(_said(created), file=out)
    print_facts(out, [("GPUs", ", ".join(created["gpus"])), ("message", created["message"])])
    return 0


def cmd_reserve_list(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    states = args.state or (None if args.all else list(OPEN_RESERVATION_STATES))
    rows = _page(
        api,
        "/api/v1/reservations/",
        args.limit,
        state=states,
        owner="me" if args.mine else args.owner,
        node=args.node,
        pool=args.pool,
    )
    print_rows(out, args, RESERVATION_COLUMNS, rows)
    return 0


def cmd_reserve_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    canceled = api.call(
        "POST", f"/api/v1/reservations/{args.reservation_id}/cancel/", {"reason": args.reason}
    )
    if args.json:
        print_json(out, canceled)
    else:
        print(_said(canceled), file=out)
    return 0


# --------------------------------------------------------------------------- quota

NO_POOL = "~"  # the GPUs in no pool, in the API (scheduling.policies.quotas.NO_POOL)
QUOTA_LIMITS = ("max_gpus", "gpu_hours", "period", "fairshare_weight")


def _holder(quota: Mapping[str, Any]) -> str:
    return f"user {quota['user']}" if quota["user"] else f"project {quota['project']}"


def _of(used: float, limit: float | None) -> str:
    """``6 / 8``, or ``6 / -`` without a limit."""
    return f"{used:g} / {'-' if limit is None else f'{limit:g}'}"


QUOTA_COLUMNS = (
    Column("ID", lambda q: q["id"], align="right"),
    Column("HOLDER", _holder),
    Column("POOL", lambda q: q["pool"]),
    Column("GPUS", lambda q: _of(q["gpus_in_use"], q["max_gpus"]), align="right"),
    Column("GPU-HOURS", lambda q: _of(q["gpu_hours_used"], q["gpu_hours"]), align="right"),
    Column("PERIOD", lambda q: q["period"]),
    Column("WEIGHT", lambda q: q["fairshare_weight"], align="right"),
)


def cmd_quota_show(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    if not (args.all or args.user or args.project):
        return _own_quotas(api, args, out)
    rows = [
        quota
        for quota in api.every("/api/v1/quotas/")
        if (args.user is None or quota["user"] == args.user)
        and (args.project is None or quota["project"] == args.project)
    ]
    print_rows(out, args, QUOTA_COLUMNS, rows)
    return 0


def _own_quotas(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Yours and your projects', each as the pages say it."""
    lines = api.call("GET", "/api/v1/quotas/mine/")
    if args.json:
        print_json(out, lines)
        return 0
    for line in lines:
        over = " (at its limit: new work waits, or borrows idle GPUs)" if line["over"] else ""
        print(f"quota {line['quota']}: {line['text']}{over}", file=out)
    if not lines:
        print("no quota limits you or your projects", file=out)
    return 0


def cmd_quota_set(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Change the holder's quota in the pool, or add one (admins)."""
    pool = None if args.pool in (None, NO_POOL) else args.pool
    limits = {
        name: getattr(args, name) for name in QUOTA_LIMITS if getattr(args, name) is not UNCHANGED
    }
    existing = next(
        (
            quota
            for quota in api.every("/api/v1/quotas/")
            if quota["pool"] == pool
            and quota["user"] == args.user
            and quota["project"] == (args.project or "")
        ),
        None,
    )
    if existing is not None:
        quota = api.call("PATCH", f"/api/v1/quotas/{existing['id']}/", limits)
        done = "changed"
    else:
        holder = {"user": args.user} if args.user else {"project": args.project}
        quota = api.call("POST", "/api/v1/quotas/", {"pool": pool, **holder, **limits})
        done = "added"
    if args.json:
        print_json(out, quota)
        return 0
    print(f"quota {quota['id']} {done}: {_holder(quota)} in {_pool_words(quota)}", file=out)
    print_facts(
        out,
        [
            ("GPUs at once", _of(quota["gpus_in_use"], quota["max_gpus"])),
            (f"GPU-hours a {quota['period']}", _of(quota["gpu_hours_used"], quota["gpu_hours"])),
            ("fair-share weight", quota["fairshare_weight"]),
        ],
    )
    return 0


def _pool_words(quota: Mapping[str, Any]) -> str:
    return f"pool {quota['pool']}" if quota["pool"] else "no pool"


UNCHANGED = object()  # an option of ``quota set`` not given: the quota keeps that value


def _limit(text: str) -> int | None:
    """A limit, or ``none`` for no limit."""
    if text == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, or none") from None


# --------------------------------------------------------------------------- alerts


def _alert_where(alert: Mapping[str, Any]) -> str:
    gpu = f"/GPU{alert['gpu_index']}" if alert["gpu_index"] is not None else ""
    return f"{alert['node'] or ''}{gpu}"


ALERT_COLUMNS = (
    Column("ID", lambda a: a["id"], align="right"),
    Column("STATE", lambda a: a["state"], coloured=True),
    Column("SEVERITY", lambda a: a["severity"], coloured=True),
    Column("WHERE", _alert_where),
    Column("OPENED", lambda a: local_time(a["opened_at"])),
    Column("ACKNOWLEDGED", lambda a: a["acknowledged_by"]),
    Column("SUMMARY", lambda a: a["summary"]),
)


def cmd_alerts(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    rows = _page(
        api,
        "/api/v1/alerts/",
        args.limit,
        state="firing" if args.firing else None,
        severity=args.severity,
        node=args.node,
        acknowledged="false" if args.unacknowledged else None,
    )
    print_rows(out, args, ALERT_COLUMNS, rows)
    return 0


def cmd_alerts_ack(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    alert = api.call("POST", f"/api/v1/alerts/{args.alert_id}/ack/", {"comment": args.comment})
    if args.json:
        print_json(out, alert)
    else:
        print(
            f"alert {alert['id']} acknowledged by {alert['acknowledged_by']}: {alert['summary']}",
            file=out,
        )
    return 0


# --------------------------------------------------------------------------- audit


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str:
    """An audit row's before/after as one compact line: ``state: available→draining`` for
    each field that changed, ``name=laptop`` for one only set, ``name: laptop→-`` for one
    only cleared; fields with the same value on both sides are left out."""
    before, after = before or {}, after or {}
    parts = []
    for name in [*before, *(name for name in after if name not in before)]:
        if name not in after:
            parts.append(f"{name}: {_value(before[name])}→-")
        elif name not in before:
            parts.append(f"{name}={_value(after[name])}")
        elif before[name] != after[name]:
            parts.append(f"{name}: {_value(before[name])}→{_value(after[name])}")
    return ", ".join(parts)


def _target_text(event: Mapping[str, Any]) -> str:
    if event["object_repr"]:
        return event["object_repr"]
    return f"{event['target_type']}:{event['target_id']}" if event["target_type"] else ""


AUDIT_COLUMNS = (
    Column("TIME", lambda e: local_time(e["time"], seconds=True)),
    Column("ACTOR", lambda e: e["actor"]),
    Column("CHANNEL", lambda e: e["channel"]),
    Column("EVENT", lambda e: e["event_type"]),
    Column("TARGET", _target_text),
    Column("CHANGES", lambda e: changes(e["before"], e["after"])),
    Column("MESSAGE", lambda e: one_line(e["message"])),
)


def target_filters(api: Api, text: str) -> dict[str, str]:
    """``--target`` as the audit API's filters: ``TYPE:ID`` (``scheduling.job:12``,
    ``job:12``, ``gpu:GPU-...``, ``node:dgx-01``), or alone a job id, a GPU UUID or a node's
    hostname. GPUs are audited by their UUID, nodes by their key (looked up here)."""
    kind, _, key = text.partition(":") if ":" in text else ("", "", text)
    if not kind:
        kind = "job" if key.isdigit() else "gpu" if GPU_UUID.fullmatch(key) else "node"
    if kind == "node" and not key.isdigit():
        key = str(api.call("GET", f"/api/v1/nodes/{quote(key, safe='')}/")["id"])
    return {"target_type": kind, "target_id": key}


def cmd_audit(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    now = datetime.now(UTC)
    rows = _page(
        api,
        "/api/v1/audit/",
        args.limit,
        since=args.since and moment(args.since, now, ago=True).isoformat(),
        until=args.until and moment(args.until, now, ago=True).isoformat(),
        actor=args.actor,
        channel=args.channel,
        event_type=args.event,
        **(target_filters(api, args.target) if args.target else {}),
    )
    print_rows(out, args, AUDIT_COLUMNS, rows)
    return 0


# --------------------------------------------------------------------------- login


def _ask(prompt: str) -> str:
    """One line typed at the terminal (the prompt on stderr: stdout stays the verb's)."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise ApiError(None, "no answer (end of input)")
    return line.strip()


def cmd_login(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Exchange a user name and password for a new API token (``POST /api/v1/tokens/`` with
    HTTP basic auth) and keep it, with the server's address, for the next verbs; the token it
    replaces is revoked."""
    if args.password_stdin and not args.username:
        sys.stderr.write("gpuadmin login: --password-stdin needs --username\n")
        return EXIT_USAGE
    try:
        saved = Credentials.load()
    except ApiError:
        saved = None  # unreadable: replaced below
    url = args.url or os.environ.get("GPUADMIN_URL") or (saved.url if saved else "")
    if not url and not args.password_stdin:
        url = _ask(f"Server [{DEFAULT_URL}]: ")
    url = url or DEFAULT_URL
    username = args.username or _ask("User name: ")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
    name = f"gpuadmin login on {socket.gethostname()}"[:100]
    signing_in = Api(url, "", channel=api.channel, password=(username, password))
    try:
        token = signing_in.call("POST", "/api/v1/tokens/", {"name": name})
    except ApiError as exc:
        if exc.status == 401:
            sys.stderr.write(f"gpuadmin login: wrong user name or password for {url}\n")
            return EXIT_FAILED
        raise
    if saved is not None and same_server(saved.url, url):
        _revoke(saved, api.channel)
    path = Credentials(url, username, token["key"], token["id"]).save()
    print(f"logged in to {url} as {username}: API token {token['id']} kept in {path}", file=out)
    return 0


def _revoke(saved: Credentials, channel: str) -> bool:
    """Revoke a kept token through the API: False when it was revoked already (a 401)."""
    try:
        Api(saved.url, saved.token, channel=channel).call(
            "DELETE", f"/api/v1/tokens/{saved.token_id}/"
        )
    except ApiError as exc:
        if exc.status != 401:
            raise
        return False
    return True


def cmd_logout(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Revoke the kept token and delete the credentials file."""
    saved = Credentials.load()
    if saved is None:
        print(f"not logged in (no {Credentials.path()})", file=out)
        return 0
    revoked = "revoked" if _revoke(saved, api.channel) else "was revoked already"
    Credentials.forget()
    print(f"logged out of {saved.url}: API token {saved.token_id} {revoked}", file=out)
    return 0


# --------------------------------------------------------------------------- arguments


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The ``reserve``, ``quota``, ``alerts``, ``audit``, ``login`` and ``logout`` verbs."""
    _add_reserve(verbs)
    _add_quota(verbs)
    _add_alerts(verbs)
    _add_audit(verbs)

    login = verbs.add_parser(
        "login", help="get an API token with your password and keep it for the next verbs"
    )
    login.add_argument(
        "--url", help=f"the server (default GPUADMIN_URL, else asked: {DEFAULT_URL})"
    )
    login.add_argument("--username", help="your user name (default: asked)")
    login.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin (scripts)"
    )
    login.set_defaults(run=run_verb(cmd_login, from_env=False))
    logout = verbs.add_parser("logout", help="revoke the kept API token and delete it")
    logout.set_defaults(run=run_verb(cmd_logout, from_env=False))


def _add_reserve(verbs: argparse._SubParsersAction) -> None:
    reserve = verbs.add_parser("reserve", help="book GPUs for a time window; list, cancel (API)")
    actions = reserve.add_subparsers(dest="action", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="request a reservation")
    create.add_argument("--gpus", type=int, metavar="N", help="GPUs to book (default 1)")
    create.add_argument("--node", help="on this node (its hostname)")
    create.add_argument(
        "--gpu", action="append", metavar="UUID", help="exactly this GPU (repeatable)"
    )
    create.add_argument("--model", help="GPUs of this model")
    create.add_argument("--pool", help="in this pool (default: the GPUs in no pool)")
    create.add_argument("--project")
    create.add_argument("--note", "--reason", dest="note", help="what it is for")
    create.add_argument("--start", type=_time, metavar="TIME", help=f"default now; {TIME_HELP}")
    until = create.add_mutually_exclusive_group(required=True)
    until.add_argument("--end", type=_time, metavar="TIME", help=TIME_HELP)
    until.add_argument("--duration", type=duration, metavar="DURATION", help="e.g. 2h, 1d, 90m")
    add_json_flag(create)
    create.set_defaults(run=run_verb(cmd_reserve_create))

    listing = actions.add_parser("list", help="reservations requested or approved (--all: any)")
    listing.add_argument("--state", action="append", choices=RESERVATION_STATES)
    listing.add_argument("--all", action="store_true", help="every state")
    owner = listing.add_mutually_exclusive_group()
    owner.add_argument("--mine", action="store_true", help="yours only")
    owner.add_argument("--owner", metavar="USER")
    listing.add_argument("--node", help="asking for it or holding GPUs on it")
    listing.add_argument("--pool")
    listing.add_argument("--limit", type=int, default=100)
    add_json_flag(listing)
    listing.set_defaults(run=run_verb(cmd_reserve_list))

    cancel = actions.add_parser("cancel", help="withdraw a reservation (before its start)")
    cancel.add_argument("reservation_id", type=int, metavar="ID")
    cancel.add_argument("--reason", default="")
    add_json_flag(cancel)
    cancel.set_defaults(run=run_verb(cmd_reserve_cancel))


def _add_quota(verbs: argparse._SubParsersAction) -> None:
    quota = verbs.add_parser("quota", help="quotas and what they hold now; set them (admins)")
    actions = quota.add_subparsers(dest="action", required=True, metavar="ACTION")

    show = actions.add_parser("show", help="yours, or a user's, a project's or all (a table)")
    which = show.add_mutually_exclusive_group()
    which.add_argument("--user", metavar="USER")
    which.add_argument("--project")
    which.add_argument("--all", action="store_true", help="every quota you may read")
    add_json_flag(show)
    show.set_defaults(run=run_verb(cmd_quota_show))

    put = actions.add_parser("set", help="change a quota, or add it (admins)")
    holder = put.add_mutually_exclusive_group(required=True)
    holder.add_argument("--user", metavar="USER")
    holder.add_argument("--project")
    put.add_argument("--pool", help="the pool (default: the GPUs in no pool)")
    put.add_argument("--max-gpus", type=_limit, default=UNCHANGED, metavar="N|none")
    put.add_argument("--gpu-hours", type=_limit, default=UNCHANGED, metavar="N|none")
    put.add_argument("--period", choices=("day", "week", "month"), default=UNCHANGED)
    put.add_argument(
        "--weight",
        dest="fairshare_weight",
        type=int,
        default=UNCHANGED,
        metavar="N",
        help="fair-share weight",
    )
    add_json_flag(put)
    put.set_defaults(run=run_verb(cmd_quota_set))


def _add_alerts(verbs: argparse._SubParsersAction) -> None:
    alerts = verbs.add_parser("alerts", help="alerts, firing first; alerts ack ID (operators)")
    alerts.add_argument("--firing", action="store_true", help="firing ones only")
    alerts.add_argument("--severity", choices=("info", "warning", "critical"))
    alerts.add_argument("--node", help="of this node (its hostname)")
    alerts.add_argument("--unacknowledged", action="store_true", help="not acknowledged yet")
    alerts.add_argument("--limit", type=int, default=100)
    add_json_flag(alerts)
    alerts.set_defaults(run=run_verb(cmd_alerts))
    actions = alerts.add_subparsers(dest="action", metavar="ack", title="actions")
    ack = actions.add_parser("ack", help="acknowledge a firing alert")
    ack.add_argument("alert_id", type=int, metavar="ID")
    ack.add_argument("--comment", default="", help="what you did or will do")
    add_json_flag(ack)
    ack.set_defaults(run=run_verb(cmd_alerts_ack))


def _add_audit(verbs: argparse._SubParsersAction) -> None:
    audit = verbs.add_parser("audit", help="the audit log, newest first (operators and admins)")
    audit.add_argument("--since", type=_time, metavar="TIME", help="e.g. 1h, 2d, or ISO 8601")
    audit.add_argument("--until", type=_time, metavar="TIME", help="before this time")
    audit.add_argument("--actor", metavar="USER", help="a user name, or a process")
    audit.add_argument(
        "--target",
        metavar="TARGET",
        help="TYPE:ID (job:12, scheduling.job:12), a job id, a GPU UUID or a node's hostname",
    )
    audit.add_argument("--channel", help="web, api, or a CLI verb such as 'cli drain'")
    audit.add_argument("--event", metavar="TYPE", help="e.g. job.canceled, or job.* for all")
    audit.add_argument("--limit", type=int, default=100)
    add_json_flag(audit)
    audit.set_defaults(run=run_verb(cmd_audit))

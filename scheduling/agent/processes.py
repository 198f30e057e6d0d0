"""A job's processes as /proc shows them (identity across agent restarts, its group alive or
signalled), and its log file's rotation and tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
TAIL_BLOCK = 64 * 1024


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of a process, if it exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            raw = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and ")": the other fields follow its last ")".
    rest = raw[raw.rindex(b")") + 2 :].split()
    return rest[0].decode(), int(rest[2]), int(rest[19])


def live_start_ticks(pid: int) -> int | None:
    """A running process's start time; None if it is gone or a zombie."""
    stat = read_stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[2]


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies hold nothing and are ignored)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for name in os.listdir("/proc"):
        stat = read_stat(int(name)) if name.isdecimal() else None
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            return True
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def backup_path(log: Path, n: int) -> Path:
    return log.with_name(f"{log.name}.{n}")


def rotate_log(log: Path, max_bytes: int, backups: int) -> None:
    """Copytruncate a log past ``max_bytes``: its newest bytes become ``.1`` (then ``.2`` ...),
    at most ``max_bytes`` each and ``backups`` files in all; older backups shift up or go.
    Backups belong to the log's owner (the job's) and have its mode."""
    try:
        stat = log.stat()
    except FileNotFoundError:
        return
    size = stat.st_size
    if size <= max_bytes:
        return
    pieces = min(backups, -(-size // max_bytes))
    for n in range(backups, 0, -1):
        backup = backup_path(log, n)
        if n + pieces > backups:
            backup.unlink(missing_ok=True)
        elif backup.exists():
            os.replace(backup, backup_path(log, n + pieces))
    with log.open("r+b") as file:
        for n in range(1, pieces + 1):
            start = max(0, size - n * max_bytes)
            file.seek(start)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            backup_fd = os.open(backup_path(log, n), flags, stat.st_mode & 0o777)
            with open(backup_fd, "wb") as piece:
                if (stat.st_uid, stat.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(backup_fd, stat.st_uid, stat.st_gid)
                piece.write(file.read(size - (n - 1) * max_bytes - start))
        file.truncate(0)


def last_lines(data: bytes, lines: int) -> bytes:
    # A final newline ends the last line; it does not start an empty one.
    start = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            return data
    return data[start + 1 :]

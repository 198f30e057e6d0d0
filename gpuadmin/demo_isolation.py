"""What keeps `gpuadmin up`'s demo jobs out of the installation that runs them: an unprivileged
Unix account of their own (made when `up` runs as root) and the modes of the data folder
(docs/administration/security.md: what a demo job and a node can read).

Plain Python: no Django imports.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

#: The account `gpuadmin up`, run as root, makes for its demo jobs.
JOB_ACCOUNT = "gpuadmin-job"
_NO_LOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin")

#: Folders jobs pass through to their own scratch folders and logs (``agent/<node>/work/<job>``,
#: ``agent/<node>/logs/``): entered, never listed.
PASSAGE_MODE = 0o711
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# The embedded PostgreSQL's folder: its own modes, its own account's (``pgserver`` as root).
_OWN_MODES = {"pgdata"}


class AccountError(Exception):
    """The demo jobs' account cannot be made or used; the message says why."""


def ensure_account(name: str) -> pwd.struct_passwd:
    """The Unix account ``name``, made when the host lacks it: a system account with a group of
    its own, no home and no login shell (``useradd``, so root only)."""
    with suppress(KeyError):
        return _unprivileged(pwd.getpwnam(name))
    shell = next((path for path in _NO_LOGIN_SHELLS if os.path.exists(path)), "/bin/false")
    argv = ["useradd", "--system", "--user-group", "--no-create-home"]
    argv += ["--home-dir", "/nonexistent", "--shell", shell, name]
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        why = "useradd is not installed"
        raise AccountError(f"cannot make the Unix account {name}: {why}") from None
    except subprocess.CalledProcessError as exc:
        with suppress(KeyError):  # made meanwhile by another `gpuadmin up`
            return _unprivileged(pwd.getpwnam(name))
        why = exc.stderr.strip() or f"useradd exited with status {exc.returncode}"
        raise AccountError(f"cannot make the Unix account {name}: {why}") from None
    return _unprivileged(pwd.getpwnam(name))


def _unprivileged(entry: pwd.struct_passwd) -> pwd.struct_passwd:
    if entry.pw_uid == 0:
        raise AccountError(f"the Unix account {entry.pw_name} is root (uid 0): demo jobs never are")
    return entry


def protect_data_dir(data_dir: Path, nodes: Iterable[str]) -> None:
    """Keep jobs' accounts out of the data folder: the folder, ``agent/`` and each node's folder
    there are entered but not listed (:data:`PASSAGE_MODE`); every other entry (the
    simulator's state, Redis, the secret key, the beat schedule) is this account's alone
    (0700/0600). Inside a node's folder the agent keeps its credential (0600) and its
    executor's records (0700) private and gives each job its own scratch folder and log."""
    agents = data_dir / "agent"
    for path in (data_dir, agents, *(agents / node for node in nodes)):
        path.mkdir(mode=PASSAGE_MODE, parents=True, exist_ok=True)
        path.chmod(PASSAGE_MODE)
    (data_dir / "sim").mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    for entry in data_dir.iterdir():
        if entry == agents or entry.name in _OWN_MODES or entry.is_symlink():
            continue
        entry.chmod(PRIVATE_DIR_MODE if entry.is_dir() else PRIVATE_FILE_MODE)

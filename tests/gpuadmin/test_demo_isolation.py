"""`gpuadmin up`'s demo jobs: the account they run as and the data folder they cannot read."""

import pwd
import subprocess

import pytest

from gpuadmin.demo_isolation import AccountError, ensure_account, protect_data_dir
from tests.unix_accounts import new_name, requires_root


def mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_the_data_folder_is_entered_on_the_way_to_a_jobs_folder_and_read_by_no_job(tmp_path):
    data = tmp_path / "data"
    (data / "redis").mkdir(parents=True, mode=0o755)
    (data / "pgdata").mkdir(mode=0o750)
    (data / "agent" / "old-node").mkdir(parents=True, mode=0o755)
    (data / "secret_key").write_text("k" * 50)
    (data / "celerybeat-schedule.dat").write_text("")
    (data / "secret_key").chmod(0o644)
    (data / "celerybeat-schedule.dat").chmod(0o644)

    protect_data_dir(data, ["dgx-01"])

    passages = (data, data / "agent", data / "agent" / "dgx-01")
    assert [mode(path) for path in passages] == [0o711, 0o711, 0o711]
    assert mode(data / "sim") == mode(data / "redis") == 0o700
    assert mode(data / "secret_key") == mode(data / "celerybeat-schedule.dat") == 0o600
    assert mode(data / "pgdata") == 0o750  # PostgreSQL's own
    assert mode(data / "agent" / "old-node") == 0o755  # not a node of this fleet: left alone

    protect_data_dir(data, ["dgx-01"])  # again, on the next start: the same
    assert mode(data / "agent" / "dgx-01") == 0o711


@requires_root
def test_the_demo_jobs_account_is_made_once_unprivileged_without_a_login():
    name = new_name("gpajob")
    try:
        made = ensure_account(name)
        assert made.pw_uid != 0 and made.pw_shell.endswith(("nologin", "false"))
        assert made.pw_dir == "/nonexistent"
        assert ensure_account(name) == made == pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_root_is_never_the_demo_jobs_account():
    with pytest.raises(AccountError, match="root is root \\(uid 0\\): demo jobs never are"):
        ensure_account("root")

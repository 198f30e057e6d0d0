"""Unix accounts for the tests of jobs that run as their owners: real ones, created with
``useradd`` (root only: CI runs as root), and the test's own for jobs run by real agents."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import User

from gpuadmin.access.models import UnixAccount

requires_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="creating Unix accounts and starting jobs as them needs root (CI runs as root)",
)


def new_name(prefix: str = "gpa") -> str:
    """A Unix user or group name no one has."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@contextmanager
def unix_user(name: str | None = None, *, extra_group: bool = True) -> Iterator[pwd.struct_passwd]:
    """A Unix account (its own group, and one supplementary group when ``extra_group``),
    removed afterwards."""
    name = name or new_name()
    group = f"{name}x"
    try:
        if extra_group:
            subprocess.run(["groupadd", group], check=True)
        groups = ["--groups", group] if extra_group else []
        subprocess.run(
            ["useradd", "--user-group", "--no-create-home", "--shell", "/bin/sh", *groups, name],
            check=True,
        )
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        if extra_group:
            subprocess.run(["groupdel", group], check=False, capture_output=True)


def runs_as_this_account(user: User) -> None:
    """Jobs of ``user`` run as the test's own account (root in CI, so allowed), as real agents
    started by a test need: its made-up people have no Unix account."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    UnixAccount.objects.update_or_create(user=user, defaults={"username": me, "allow_root": True})

"""Settings for mypy's Django plugin, which imports the settings and the apps but connects to
nothing: the real settings with placeholder service URLs, so that type checking needs no
environment and starts no embedded servers (tests/settings.py would)."""

import os

for name, value in {
    "DATABASE_URL": "postgresql://mypy@localhost/mypy",
    "REDIS_URL": "redis://localhost/0",
    "SECRET_KEY": "mypy-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
}.items():
    os.environ.setdefault(name, value)

from gpuadmin.settings import *  # noqa: E402, F403

"""Test settings: the real settings module, with the test environment filled in first.

With DATABASE_URL/REDIS_URL unset, private embedded servers are started under the data
directory (and stopped at the end of the session by tests/conftest.py).
"""

import os
from urllib.parse import urlsplit

from gpuadmin.embedded import data_dir_from_env, ensure_service_urls

os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz")
# One central Celery queue per session (inherited by the workers tests start), so sessions
# sharing a Redis never run each other's tasks against the wrong database. Under pytest-xdist
# the controller names it and its processes inherit the name; each process has its own Redis
# database (below), so each still has a queue of its own.
os.environ.setdefault("GPUADMIN_CENTRAL_QUEUE", f"central-{os.getpid()}")
# The agents tests start confine their jobs in a cgroup subtree of the session's own (removed
# at its end by tests/conftest.py), never one a real agent or another session uses.
os.environ.setdefault("GPUADMIN_CGROUP_ROOT", f"gpuadmin-tests-{os.getpid()}")
EMBEDDED_SERVICES = ensure_service_urls(data_dir_from_env())
# Under pytest-xdist (`make test` runs two workers) each worker gets its own Redis database
# after the given one, for its live samples, throttles and marks, which are keyed by node and
# user rather than by session. Its workers and agents inherit it through REDIS_URL.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    _redis = urlsplit(os.environ["REDIS_URL"])
    _database = int(_redis.path.strip("/") or 0) + int(worker.removeprefix("gw")) + 1
    os.environ["REDIS_URL"] = _redis._replace(path=f"/{_database}").geturl()

from gpuadmin.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# No documentation site, whether or not `make docs` has built one in the checkout: /docs/ is the
# page saying how to build it. The site's own tests build theirs (tests/conftest.py: built_docs).
GPUADMIN_DOCS_DIR = BASE_DIR / "tests" / "no-docs-site"  # noqa: F405
# One test database per session, so that test runs side by side on one server never collide.
DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405
# PostgreSQL, with a flush after each transactional test that deletes rather than truncates.
DATABASES["default"]["ENGINE"] = "tests.postgres_backend"  # noqa: F405

"""gpuadmin settings: every value comes from the environment (see docs/reference/settings.md)."""

from __future__ import annotations

import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from gpuadmin.embedded import data_dir_from_env
from gpuadmin.env import (
    DEFAULT_BIND,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_rate,
    env_str,
    env_unix_user,
    parse_database_url,
    parse_redis_url,
    public_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Used only when DEBUG is on; a production process refuses to start with it.
DEV_SECRET_KEY = "gpuadmin-dev-only-insecure-secret-key-do-not-use-in-production"

DEBUG = env_bool("DEBUG", False)
# A node agent (``gpuadmin agent`` sets it) has no database: it talks to the central side
# through the broker only, and any use of the ORM raises (``gpuadmin.nodb``).
GPUADMIN_AGENT = env_bool("GPUADMIN_AGENT", False)
# A node agent signs with its node credential and never holds the central key: it ignores
# SECRET_KEY and gets a throwaway one (Django wants one).
SECRET_KEY = (
    secrets.token_urlsafe(50)
    if GPUADMIN_AGENT
    else env_str("SECRET_KEY") or (DEV_SECRET_KEY if DEBUG else "")
)
if not DEBUG and SECRET_KEY in ("", DEV_SECRET_KEY):
    raise ImproperlyConfigured(
        "SECRET_KEY is unset or is the development key while DEBUG is off: set SECRET_KEY "
        "(or SECRET_KEY_FILE) to a long random value, or run through `gpuadmin up`, "
        "which keeps a generated key in the data directory."
    )
if len(SECRET_KEY) < 32:
    raise ImproperlyConfigured("SECRET_KEY must be at least 32 characters long")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

GPUADMIN_DATA_DIR = data_dir_from_env()
GPUADMIN_NVML = env_choice("GPUADMIN_NVML", ("real", "sim"), "real")
GPUADMIN_SIM_FLEET = env_str("GPUADMIN_SIM_FLEET") or str(BASE_DIR / "gpuadmin" / "demo_fleet.json")
GPUADMIN_SIM_STATE_DIR = GPUADMIN_DATA_DIR / "sim"
# What a node agent scans: its node name, and the simulated machine model when GPUADMIN_NVML=sim.
GPUADMIN_NODE_NAME = env_str("GPUADMIN_NODE_NAME") or socket.gethostname()
GPUADMIN_SIM_MODEL = env_str("GPUADMIN_SIM_MODEL")
# Node agents: how often they heartbeat and re-scan, and how long silence is tolerated before
# a node is shown unreachable.
GPUADMIN_HEARTBEAT_INTERVAL_S = env_int("GPUADMIN_HEARTBEAT_INTERVAL_S", 10, minimum=1)
GPUADMIN_HEARTBEAT_GRACE_S = env_int("GPUADMIN_HEARTBEAT_GRACE_S", 30, minimum=1)
GPUADMIN_RESCAN_INTERVAL_S = env_int("GPUADMIN_RESCAN_INTERVAL_S", 300, minimum=5)
# How often agents publish live GPU samples (utilization, memory, temperature, power) to Redis.
GPUADMIN_SAMPLE_INTERVAL_S = env_int("GPUADMIN_SAMPLE_INTERVAL_S", 2, minimum=1)
# --- health: telemetry history, health events and recovery policies, quarantine, alerts
# Agents: how many samples the Redis stream gpuadmin:samples keeps for the history ingest
# (approximate trim), and after how many consecutive failed samples a GPU's failing NVML
# queries become a health event.
GPUADMIN_SAMPLE_STREAM_MAX = env_int("GPUADMIN_SAMPLE_STREAM_MAX", 100_000, minimum=100)
GPUADMIN_QUERY_FAILURES = env_int("GPUADMIN_QUERY_FAILURES", 3, minimum=1)
# Telemetry history: the Redis stream agents add each sample to, how often the central worker
# copies it into PostgreSQL, and how long raw samples (hours) and 1-minute rollups (days) stay.
GPUADMIN_SAMPLE_STREAM = env_str("GPUADMIN_SAMPLE_STREAM") or "gpuadmin:samples"
GPUADMIN_INGEST_INTERVAL_S = env_int("GPUADMIN_INGEST_INTERVAL_S", 2, minimum=1)
GPUADMIN_RAW_RETENTION_H = env_int("GPUADMIN_RAW_RETENTION_H", 6, minimum=1)
GPUADMIN_ROLLUP_RETENTION_D = env_int("GPUADMIN_ROLLUP_RETENTION_D", 30, minimum=1)
# GET /metrics (Prometheus): open to anyone who reaches it unless this bearer token is set.
GPUADMIN_METRICS_TOKEN = env_str("GPUADMIN_METRICS_TOKEN")
# Alerts: how often the rules are evaluated; webhooks' attempts (exponential backoff from
# GPUADMIN_WEBHOOK_BACKOFF_S), timeout, and the address links in alerts point to.
GPUADMIN_ALERT_INTERVAL_S = env_int("GPUADMIN_ALERT_INTERVAL_S", 10, minimum=1)
GPUADMIN_WEBHOOK_MAX_ATTEMPTS = env_int("GPUADMIN_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
GPUADMIN_WEBHOOK_BACKOFF_S = env_int("GPUADMIN_WEBHOOK_BACKOFF_S", 5, minimum=1)
GPUADMIN_WEBHOOK_TIMEOUT_S = env_int("GPUADMIN_WEBHOOK_TIMEOUT_S", 10, minimum=1)
# The backoff's cap: the longest countdown any task is sent again with (other tasks' retries
# wait at most 10 s, gpuadmin/celery.py), which the broker's visibility timeout must exceed.
GPUADMIN_WEBHOOK_BACKOFF_MAX_S = 600
# Unset: the address `up`/`serve` listen on (GPUADMIN_BIND), which they export to their children.
GPUADMIN_PUBLIC_URL = env_str("GPUADMIN_PUBLIC_URL") or public_url(
    env_str("GPUADMIN_BIND") or DEFAULT_BIND
)
GPUADMIN_ALERTMANAGER_RESEND_S = env_int("GPUADMIN_ALERTMANAGER_RESEND_S", 60, minimum=5)
# Quarantine: the circuit breaker stops automatic fencing when more GPUs than
# max(GPUADMIN_BREAKER_MIN_GPUS, GPUADMIN_BREAKER_SHARE x the fleet) were fenced within
# GPUADMIN_BREAKER_WINDOW_S; a GPU quarantined GPUADMIN_FLAP_LIMIT times in 24 h is held for a
# human; a hot GPU's probation starts GPUADMIN_THERMAL_HYSTERESIS_C below the policy's threshold.
# Beat moves open quarantines along (a cleared fault to probation, a passed probation back to
# service) every GPUADMIN_QUARANTINE_REVIEW_S.
GPUADMIN_BREAKER_WINDOW_S = env_int("GPUADMIN_BREAKER_WINDOW_S", 300, minimum=1)
GPUADMIN_BREAKER_MIN_GPUS = env_int("GPUADMIN_BREAKER_MIN_GPUS", 3, minimum=0)
GPUADMIN_BREAKER_SHARE = env_float("GPUADMIN_BREAKER_SHARE", 0.1, minimum=0, maximum=1)
GPUADMIN_FLAP_LIMIT = env_int("GPUADMIN_FLAP_LIMIT", 3, minimum=2)
GPUADMIN_THERMAL_HYSTERESIS_C = env_int("GPUADMIN_THERMAL_HYSTERESIS_C", 5, minimum=0)
GPUADMIN_QUARANTINE_REVIEW_S = env_int("GPUADMIN_QUARANTINE_REVIEW_S", 10, minimum=1)
# Recovery policies: whether a policy may reset a GPU through its node's agent ("auto": on for
# simulated nodes, off on real hardware, where a reset stays an admin's decision).
GPUADMIN_GPU_RESET = env_choice("GPUADMIN_GPU_RESET", ("auto", "on", "off"), "auto")
# Scheduling: beat's backstop placement pass (passes also run on every submit/finish), and how
# node agents run jobs: SIGTERM-to-SIGKILL grace on cancel/timeout, log size limit and rotation.
GPUADMIN_PLACEMENT_INTERVAL_S = env_int("GPUADMIN_PLACEMENT_INTERVAL_S", 30, minimum=1)
# How long the holder of a lease (the placement loop's, beat's) keeps it without renewing it: a
# worker or beat that dies mid-way is replaced after at most this long (gpuadmin.leases).
GPUADMIN_LEASE_TTL_S = env_int("GPUADMIN_LEASE_TTL_S", 15, minimum=3)
GPUADMIN_ACCOUNTING_INTERVAL_S = env_int("GPUADMIN_ACCOUNTING_INTERVAL_S", 300, minimum=10)
# How long a placed job may stay SCHEDULED before its agent reports it started; then it is
# re-queued (like Slurm's batch job launch timeout).
GPUADMIN_SCHEDULED_CONFIRM_S = env_int("GPUADMIN_SCHEDULED_CONFIRM_S", 120, minimum=1)
# How long a MIG re-layout waits for the GPU's jobs to end before it gives up (rolled back).
GPUADMIN_MIG_RELAYOUT_DRAIN_S = env_int("GPUADMIN_MIG_RELAYOUT_DRAIN_S", 86400, minimum=60)
GPUADMIN_JOB_KILL_GRACE_S = env_int("GPUADMIN_JOB_KILL_GRACE_S", 10, minimum=0)
# How long after the kill grace a stopping job waits for a reachable agent to report its
# processes gone; then the node is drained ("Kill task failed") and the job ends (Slurm's
# UnkillableStepTimeout, scheduling.jobs.reports.end_unkillable_stops).
GPUADMIN_UNKILLABLE_TIMEOUT_S = env_int("GPUADMIN_UNKILLABLE_TIMEOUT_S", 60, minimum=1)
GPUADMIN_JOB_LOG_MAX_BYTES = env_int("GPUADMIN_JOB_LOG_MAX_BYTES", 16 * 1024 * 1024, minimum=1024)
GPUADMIN_JOB_LOG_BACKUPS = env_int("GPUADMIN_JOB_LOG_BACKUPS", 3, minimum=0)
# What runs a node agent's jobs that give a container image (auto: the first of docker, podman,
# apptainer on PATH; none: such jobs fail instead of running on the host).
# "auto": an agent running as root starts each job as its owner's Unix account; "off": every job
# runs as the agent's own account (gpuadmin up's demo agents: the demo's users have none).
GPUADMIN_JOBS_AS_OWNER = env_choice("GPUADMIN_JOBS_AS_OWNER", ("auto", "off"), "auto")
# Central side: the Unix account the jobs of people an admin gave none run as (unset: their
# user name); `gpuadmin up` run as root sets it to the account it makes for its demo jobs.
GPUADMIN_DEFAULT_UNIX_ACCOUNT = env_unix_user("GPUADMIN_DEFAULT_UNIX_ACCOUNT")
GPUADMIN_CONTAINER_RUNTIME = env_choice(
    "GPUADMIN_CONTAINER_RUNTIME", ("auto", "docker", "podman", "apptainer", "none"), "auto"
)
# Who reads a job's private data (its log, environment values and command line) besides its
# owner and admins (Slurm's PrivateData=jobs): "owner" (nobody else), "operators", "everyone"
# (everyone signed in, viewers included).
GPUADMIN_PRIVATE_DATA = env_choice(
    "GPUADMIN_PRIVATE_DATA", ("owner", "operators", "everyone"), "owner"
)
# Job confinement (scheduling.agent.isolation): which cgroup hierarchy (auto: v2 where the unified
# hierarchy has it, else the v1 controllers; off: none), the agent's subtree in it, each job's
# process limit (0: none) and the devices a job may open besides its own GPUs (device rules;
# the default: InfiniBand verbs, which multi-node NCCL uses). An admin allows unconfined jobs on
# a node (its catalog's "allow unconfined jobs"); container_cgroup_parent puts a docker or
# podman container's cgroup under its job's (cgroupfs drivers only).
GPUADMIN_CGROUP_VERSION = env_choice("GPUADMIN_CGROUP_VERSION", ("auto", "1", "2", "off"), "auto")
GPUADMIN_CGROUP_ROOT = env_str("GPUADMIN_CGROUP_ROOT", "gpuadmin")
GPUADMIN_JOB_PIDS_MAX = env_int("GPUADMIN_JOB_PIDS_MAX", 4096, minimum=0)
GPUADMIN_JOB_EXTRA_DEVICES = env_list("GPUADMIN_JOB_EXTRA_DEVICES", ["c 231:* rw"])
GPUADMIN_CONTAINER_CGROUP_PARENT = env_bool("GPUADMIN_CONTAINER_CGROUP_PARENT", False)
# Longest a process trusts a resolved API token without looking again (0: never cache);
# changes to tokens, users and roles invalidate the caches at once through Redis.
GPUADMIN_TOKEN_CACHE_S = env_int("GPUADMIN_TOKEN_CACHE_S", 30, minimum=0)
# Per-user rate limits (``N/min``, ``N/hour``..., or ``off``) on job submission (API and the
# submit page) and on API token creation: a 429 with Retry-After beyond them.
GPUADMIN_SUBMIT_RATE = env_rate("GPUADMIN_SUBMIT_RATE", "1200/min")
GPUADMIN_TOKEN_RATE = env_rate("GPUADMIN_TOKEN_RATE", "30/hour")

# The agent's node credential (``gpuadmin node credential create NAME``), which signs its reports.
GPUADMIN_NODE_TOKEN = env_str("GPUADMIN_NODE_TOKEN")
# How old a signed message may be when it is taken: an agent's report on the central worker
# (queued while the worker was down), an order on the agent (``gpuadmin.access.node_orders``).
GPUADMIN_NODE_REPORT_MAX_AGE_S = env_int("GPUADMIN_NODE_REPORT_MAX_AGE_S", 3600, minimum=10)

_database_url = env_str("DATABASE_URL")
_redis_url = env_str("REDIS_URL")
if not _redis_url or not (_database_url or GPUADMIN_AGENT):
    raise ImproperlyConfigured(
        "DATABASE_URL and REDIS_URL must be set (node agents: REDIS_URL only). The gpuadmin "
        "commands (gpuadmin up/serve/worker/manage, make test) set them to private embedded "
        "servers when they are unset."
    )
REDIS_URL = _redis_url
# One server, or the primary Redis Sentinels name (sentinel://): the broker, the results and
# the processes' own client all go through it (gpuadmin.env.RedisTarget).
REDIS_TARGET = parse_redis_url(_redis_url)
if GPUADMIN_AGENT:
    DATABASES: dict[str, dict[str, Any]] = {"default": {"ENGINE": "gpuadmin.nodb"}}
else:
    DATABASES = {"default": parse_database_url(_database_url)}
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Statements a connection runs this many times are prepared on the server (server-side
    # binding): PostgreSQL skips parsing and planning them, Python skips quoting every
    # parameter. 0 = Django's client-side binding, e.g. behind PgBouncer older than 1.21 in
    # transaction mode.
    _prepare_threshold = env_int("DATABASE_PREPARE_THRESHOLD", 5, minimum=0)
    if _prepare_threshold:
        DATABASES["default"]["OPTIONS"].update(
            server_side_binding=True, prepare_threshold=_prepare_threshold
        )
    # What sits between gpuadmin and PostgreSQL (docs/administration/high-availability.md):
    # "session" (a direct connection, or PgBouncer's session pooling) or "transaction"
    # (PgBouncer's transaction pooling: no cursor outlives its transaction). Nothing gpuadmin
    # keeps depends on the session (leases are rows), but LISTEN does: the listeners connect
    # to DATABASE_DIRECT_URL (default: DATABASE_URL), which must reach PostgreSQL directly
    # or through session pooling.
    _pool_mode = env_choice("DATABASE_POOL_MODE", ("session", "transaction"), "session")
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = _pool_mode == "transaction"
_direct_url = env_str("DATABASE_DIRECT_URL")
DATABASE_DIRECT = parse_database_url(_direct_url) if _direct_url else None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "gpuadmin.admin_site.AdminConfig",  # Django's admin, as gpuadmin's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.postgres",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "gpuadmin.audit",
    "gpuadmin.access",
    "gpuadmin.leases",
    "inventory",
    "health",
    "scheduling",
    "integrations.slurm",
    "integrations.ray",
    "assistant",
]

MIDDLEWARE = [
    # First, so every response carries X-Request-ID and every audit row the request's id.
    "gpuadmin.request_id.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "gpuadmin.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "gpuadmin.docs_site.DocsSiteMiddleware",  # the documentation site under /docs/
    # Pages and their 2 s partials are repetitive markup that compresses well; Django's GZip
    # pads against BREACH.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Django's MessageMiddleware, for the pages only.
    "gpuadmin.page_messages.PageMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A path argument or query parameter PostgreSQL cannot store (NUL): a 404/400, not a 500.
    "gpuadmin.text.StorableTextMiddleware",
]

ROOT_URLCONF = "gpuadmin.urls"
WSGI_APPLICATION = "gpuadmin.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "gpuadmin.audit.access.nav",
            ],
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Only deployments that run `collectstatic` (the Docker image) set it; `gpuadmin up` serves the
# files straight from the apps' and the project's static folders.
STATIC_ROOT = env_str("STATIC_ROOT") or None
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# The documentation site `make docs` builds, served under /docs/ (gpuadmin.docs_site).
GPUADMIN_DOCS_DIR = Path(env_str("GPUADMIN_DOCS_DIR") or BASE_DIR / "site")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "gpuadmin.api.AutoSchema",
    "EXCEPTION_HANDLER": "gpuadmin.api.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "gpuadmin.parsers.JSONParser",
        "gpuadmin.parsers.FormParser",
        "gpuadmin.parsers.MultiPartParser",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gpuadmin.access.tokens.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "gpuadmin.access.tokens.BasicAuthentication",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuadmin API",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # GPU states as stored, and the subset people set (maintenance): two enums, two names.
    "ENUM_NAME_OVERRIDES": {
        "GpuStateEnum": "inventory.choices.GpuState",
        "GpuMaintenanceStateEnum": "inventory.api.serializers.GPU_MAINTENANCE_STATES",
        "NodeStateEnum": "inventory.choices.NodeState",
        "GpuStatusEnum": "inventory.api.serializers.STATUS_CHOICES",
        "JobStateEnum": "scheduling.models.JobState",  # a job's and a job detail's
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",  # the default
        "scheduling.api.schema.submissions_any_of",
    ],
}

CELERY_BROKER_URL = REDIS_TARGET.celery_url
CELERY_RESULT_BACKEND = REDIS_TARGET.celery_url
# Redis's visibility timeout (kombu's): a message a worker took and has not acknowledged
# (acks late: not before its task ends) is given to another worker after this long. A task
# sent with a countdown waits unacknowledged in the worker that took it until it is due, so
# the timeout must exceed the longest countdown and the task's run after it, or the task is
# delivered again and runs twice; 5 minutes are left for that run (a webhook's post gives up
# after GPUADMIN_WEBHOOK_TIMEOUT_S) and for a wait for a free worker process, and a task sent
# without a countdown must end within the whole. It is how long the messages of a worker that
# was SIGKILLed wait (a stopped worker puts its messages back itself, and so does one that
# lost its connection once it reconnects: gpuadmin/broker.py).
GPUADMIN_BROKER_VISIBILITY_TIMEOUT_S = GPUADMIN_WEBHOOK_BACKOFF_MAX_S + 300
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **REDIS_TARGET.celery_transport_options,
    "visibility_timeout": GPUADMIN_BROKER_VISIBILITY_TIMEOUT_S,
}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = REDIS_TARGET.celery_transport_options
# The central worker's queue (placement passes, agents' reports); node agents use node.<name>.
GPUADMIN_CENTRAL_QUEUE = env_str("GPUADMIN_CENTRAL_QUEUE") or "default"
CELERY_TASK_DEFAULT_QUEUE = GPUADMIN_CENTRAL_QUEUE
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
# Only the tasks whose answer a caller waits for (``inventory.services.run_on_node``'s) store a
# result: they say ignore_result=False, and so does the caller (see gpuadmin/celery.py).
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# A node agent obeys no remote-control command (shutdown, revoke...): anyone who reaches the
# broker could send one. What it is asked to do comes as signed orders (``node_orders``).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = not GPUADMIN_AGENT
# Celery closes a worker's database connections around every task unless this is set; they
# live for DATABASE_CONN_MAX_AGE instead, checked around each task (gpuadmin/celery_db.py).
CELERY_DB_REUSE_MAX = sys.maxsize
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Every beat runs, only the holder of the beat lease sends, each task once per period
# (gpuadmin/leases/beat.py): two beats on two machines are a leader and its standby.
CELERY_BEAT_SCHEDULER = "gpuadmin.leases.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE = {
    "placement-pass": {
        "task": "scheduling.placement_pass",
        "schedule": float(GPUADMIN_PLACEMENT_INTERVAL_S),
        "options": {"expires": float(GPUADMIN_PLACEMENT_INTERVAL_S)},
    },
}
CELERY_BEAT_SCHEDULE["scheduling-account-usage"] = {
    "task": "scheduling.account_usage",
    "schedule": float(GPUADMIN_ACCOUNTING_INTERVAL_S),
    "options": {"expires": float(GPUADMIN_ACCOUNTING_INTERVAL_S)},
}
# MIG re-layouts step on (scheduling.sharing.relayout.advance_open); agents' job reports wake
# it too.
CELERY_BEAT_SCHEDULE["scheduling-advance-relayouts"] = {
    "task": "scheduling.advance_relayouts",
    "schedule": 10.0,
    "options": {"expires": 10.0},
}
# Re-queues jobs placed longer than GPUADMIN_SCHEDULED_CONFIRM_S ago that no agent started,
# ends the stops that wait for silent nodes and those past GPUADMIN_UNKILLABLE_TIMEOUT_S
# (scheduling.jobs.reports); gpuadmin check allows a stop one period more.
GPUADMIN_REQUEUE_INTERVAL_S = float(min(10, GPUADMIN_SCHEDULED_CONFIRM_S))
CELERY_BEAT_SCHEDULE["scheduling-requeue-unconfirmed"] = {
    "task": "scheduling.requeue_unconfirmed",
    "schedule": GPUADMIN_REQUEUE_INTERVAL_S,
    "options": {"expires": GPUADMIN_REQUEUE_INTERVAL_S},
}
# Ends reservations, releases unused ones (scheduling.reservations.services.sweep).
CELERY_BEAT_SCHEDULE["scheduling-sweep-reservations"] = {
    "task": "scheduling.sweep_reservations",
    "schedule": 60.0,
    "options": {"expires": 60.0},
}
# --- health: periodic tasks on the central worker
CELERY_BEAT_SCHEDULE["health-review-quarantines"] = {
    "task": "health.review_quarantines",
    "schedule": float(GPUADMIN_QUARANTINE_REVIEW_S),
    "options": {"expires": float(GPUADMIN_QUARANTINE_REVIEW_S)},
}
CELERY_BEAT_SCHEDULE["health-ingest-samples"] = {
    "task": "health.ingest_samples",
    "schedule": float(GPUADMIN_INGEST_INTERVAL_S),
    "options": {"expires": float(GPUADMIN_INGEST_INTERVAL_S)},
}
CELERY_BEAT_SCHEDULE["health-maintain-telemetry"] = {
    "task": "health.maintain_telemetry",
    "schedule": 60.0,
    "options": {"expires": 60.0},
}
CELERY_BEAT_SCHEDULE["health-evaluate-alerts"] = {
    "task": "health.evaluate_alerts",
    "schedule": float(GPUADMIN_ALERT_INTERVAL_S),
    "options": {"expires": float(GPUADMIN_ALERT_INTERVAL_S)},
}
CELERY_BEAT_SCHEDULE["health-resend-to-alertmanager"] = {
    "task": "health.resend_to_alertmanager",
    "schedule": float(GPUADMIN_ALERTMANAGER_RESEND_S),
    "options": {"expires": float(GPUADMIN_ALERTMANAGER_RESEND_S)},
}
CELERY_BEAT_SCHEDULE["health-watch-heartbeats"] = {
    "task": "health.watch_heartbeats",
    "schedule": 10.0,
    "options": {"expires": 10.0},
}
# --- integrations: Slurm clusters, each polled at its own interval, checked every tick
GPUADMIN_SLURM_TICK_S = env_int("GPUADMIN_SLURM_TICK_S", 5, minimum=1)
CELERY_BEAT_SCHEDULE["slurm-poll-clusters"] = {
    "task": "slurm.poll_clusters",
    "schedule": float(GPUADMIN_SLURM_TICK_S),
    "options": {"expires": float(GPUADMIN_SLURM_TICK_S)},
}
# --- integrations: external Ray clusters read, and their jobs followed, every tick
GPUADMIN_RAY_POLL_S = env_int("GPUADMIN_RAY_POLL_S", 5, minimum=1)
# How long gpuadmin waits for a Ray cluster's answer (a page or API call that asks one waits
# as long).
GPUADMIN_RAY_TIMEOUT_S = env_float("GPUADMIN_RAY_TIMEOUT_S", 5.0, minimum=0.1)
# Ray applications on gpuadmin's GPUs (a job's `ray`): the first port their heads listen on and
# how many heads one node can hold (each takes three ports: GCS, dashboard, client server);
# on a node, the Python that has Ray (empty: the agent's own).
GPUADMIN_RAY_HEAD_PORT = env_int("GPUADMIN_RAY_HEAD_PORT", 30000, minimum=1024)
GPUADMIN_RAY_HEADS_PER_NODE = env_int("GPUADMIN_RAY_HEADS_PER_NODE", 64, minimum=1)
GPUADMIN_RAY_PYTHON = env_str("GPUADMIN_RAY_PYTHON")
CELERY_BEAT_SCHEDULE["ray-poll"] = {
    "task": "ray.poll",
    "schedule": float(GPUADMIN_RAY_POLL_S),
    "options": {"expires": float(GPUADMIN_RAY_POLL_S)},
}
# --- the assistant: an OpenAI-compatible chat-completions endpoint with tool calling (vLLM,
# llama.cpp's server, Ollama); unset URL: the assistant is off and its page says how to set it.
GPUADMIN_ASSISTANT_URL = env_str("GPUADMIN_ASSISTANT_URL")
GPUADMIN_ASSISTANT_MODEL = env_str("GPUADMIN_ASSISTANT_MODEL")
GPUADMIN_ASSISTANT_KEY = env_str("GPUADMIN_ASSISTANT_KEY")
GPUADMIN_ASSISTANT_TIMEOUT_S = env_float("GPUADMIN_ASSISTANT_TIMEOUT_S", 120.0, minimum=1.0)
# Rounds of tool calls one question may take, and the size of one tool result sent back.
GPUADMIN_ASSISTANT_MAX_STEPS = env_int("GPUADMIN_ASSISTANT_MAX_STEPS", 8, minimum=1)
GPUADMIN_ASSISTANT_RESULT_BYTES = env_int("GPUADMIN_ASSISTANT_RESULT_BYTES", 16000, minimum=500)

LOG_LEVEL = env_choice("LOG_LEVEL", ("debug", "info", "warning", "error"), "info").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"refusal_on_one_line": {"()": "gpuadmin.logs.RefusalOnOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "gpuadmin": {"level": LOG_LEVEL},
        "django": {"level": "INFO"},
        # A page's 403: one line (who, what, why), not a traceback.
        "django.request": {"filters": ["refusal_on_one_line"]},
        # Celery's line per task received and succeeded, and beat's per task sent, would log
        # every heartbeat and backstop pass; failures still show. The tasks' own code logs the
        # state changes (jobs' transitions, scans that changed the catalog).
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
    },
}

# Security headers on every response (docs/reference/api.md, "Limits and headers"): the CSP
# allows only this origin's files (no inline or evaluated script; style attributes, which the
# MIG drawing and the memory bars use, but no inline <style>); pages cannot be framed.
CONTENT_SECURITY_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "style-src-attr": ["'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
# Behind HTTPS (a TLS proxy that sets X-Forwarded-Proto): Secure cookies, redirect plain HTTP
# (the health probe and Prometheus's scrapes of /metrics excepted) and HTTP Strict Transport
# Security.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^-/health$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

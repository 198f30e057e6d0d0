"""gpuadmin settings: every value comes from the environment (see README "Settings")."""

from __future__ import annotations

import socket
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from gpuadmin.embedded import data_dir_from_env
from gpuadmin.env import (
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
    parse_database_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Used only when DEBUG is on; a production process refuses to start with it.
DEV_SECRET_KEY = "gpuadmin-dev-only-insecure-secret-key-do-not-use-in-production"

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY") or (DEV_SECRET_KEY if DEBUG else "")
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
# Scheduling: beat's backstop placement pass (passes also run on every submit/finish), and how
# node agents run jobs: SIGTERM-to-SIGKILL grace on cancel/timeout, log size limit and rotation.
GPUADMIN_PLACEMENT_INTERVAL_S = env_int("GPUADMIN_PLACEMENT_INTERVAL_S", 30, minimum=1)
GPUADMIN_JOB_KILL_GRACE_S = env_int("GPUADMIN_JOB_KILL_GRACE_S", 10, minimum=0)
GPUADMIN_JOB_LOG_MAX_BYTES = env_int("GPUADMIN_JOB_LOG_MAX_BYTES", 16 * 1024 * 1024, minimum=1024)
GPUADMIN_JOB_LOG_BACKUPS = env_int("GPUADMIN_JOB_LOG_BACKUPS", 3, minimum=0)
# What runs a node agent's jobs that give a container image (auto: the first of docker, podman,
# apptainer on PATH; none: such jobs fail instead of running on the host).
GPUADMIN_CONTAINER_RUNTIME = env_choice(
    "GPUADMIN_CONTAINER_RUNTIME", ("auto", "docker", "podman", "apptainer", "none"), "auto"
)
# Longest a process trusts a resolved API token without looking again (0: never cache);
# changes to tokens, users and roles invalidate the caches at once through Redis.
GPUADMIN_TOKEN_CACHE_S = env_int("GPUADMIN_TOKEN_CACHE_S", 30, minimum=0)

_database_url = env_str("DATABASE_URL")
_redis_url = env_str("REDIS_URL")
if not _database_url or not _redis_url:
    raise ImproperlyConfigured(
        "DATABASE_URL and REDIS_URL must be set. The gpuadmin commands (gpuadmin up/serve/"
        "worker/manage, make test) set them to private embedded servers when they are unset."
    )
DATABASES = {"default": parse_database_url(_database_url)}
REDIS_URL = _redis_url
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Statements a connection runs this many times are prepared on the server (server-side
# binding): PostgreSQL skips parsing and planning them, Python skips quoting every parameter.
# 0 = Django's client-side binding, e.g. behind PgBouncer older than 1.21 in transaction mode.
_prepare_threshold = env_int("DATABASE_PREPARE_THRESHOLD", 5, minimum=0)
if _prepare_threshold:
    DATABASES["default"]["OPTIONS"].update(
        server_side_binding=True, prepare_threshold=_prepare_threshold
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
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
    "inventory",
    "health",
    "scheduling",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Pages and their 2 s partials compress about 10x; Django's GZip pads against BREACH.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gpuadmin.access.tokens.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuadmin API",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

CELERY_BROKER_URL = _redis_url
CELERY_RESULT_BACKEND = _redis_url
# The central worker's queue (placement passes, agents' reports); node agents use node.<name>.
GPUADMIN_CENTRAL_QUEUE = env_str("GPUADMIN_CENTRAL_QUEUE") or "default"
CELERY_TASK_DEFAULT_QUEUE = GPUADMIN_CENTRAL_QUEUE
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "placement-pass": {
        "task": "scheduling.placement_pass",
        "schedule": float(GPUADMIN_PLACEMENT_INTERVAL_S),
        "options": {"expires": float(GPUADMIN_PLACEMENT_INTERVAL_S)},
    },
}

LOG_LEVEL = env_choice("LOG_LEVEL", ("debug", "info", "warning", "error"), "info").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "gpuadmin": {"level": LOG_LEVEL},
        "django": {"level": "INFO"},
        # Celery's line per task received and succeeded, and beat's per task sent, would log
        # every heartbeat and backstop pass; failures still show. The tasks' own code logs the
        # state changes (jobs' transitions, scans that changed the catalog).
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "WARNING"},
    },
}

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

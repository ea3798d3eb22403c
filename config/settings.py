"""toolrelay settings: one module, driven by environment variables (see ``.env.example``).

Cross-setting invariants are checked as Django system checks in ``tenants/checks.py``; this module
only parses. Defaults give an embedded setup: SQLite in ``var/``, no broker (Celery tasks run in
process), a built-in simulated upstream wired by ``make run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from config.env import envbool, envfloat, envint, envlist, envstr

# Generic Django classes (ModelAdmin[Model], QuerySet[Model]) subscriptable at runtime, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("TOOLRELAY_VAR_DIR", str(BASE_DIR / "var")))

#: The placeholder secret key; the system checks refuse it outside DEBUG.
INSECURE_SECRET_KEY = "insecure-toolrelay-dev-key-change-me"  # noqa: S105 - a documented placeholder

DEBUG = envbool("DEBUG", False)
SECRET_KEY = envstr("SECRET_KEY", INSECURE_SECRET_KEY)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
#: Public base URL of the proxy, printed by ``provision`` (``<SITE_URL>/v1`` for OpenAI clients).
SITE_URL = envstr("SITE_URL", "http://127.0.0.1:8000").rstrip("/")

#: Fernet keys (urlsafe base64, 32 bytes) for upstream credentials, newest first: encryption uses
#: the first, decryption tries each, so a new key can be put in front and old rows still decrypt.
CREDENTIAL_KEYS = envlist("CREDENTIAL_KEYS")
#: Server secret for API key digests (HMAC-SHA256). Defaults to one derived from SECRET_KEY.
API_KEY_SECRET = envstr("API_KEY_SECRET")
#: How long a resolved API key / route stays in the in-process cache (seconds): bounds how long a
#: revoked key keeps working on a running process.
AUTH_CACHE_SECONDS = envfloat("AUTH_CACHE_SECONDS", 5.0)
#: Write ``ApiKey.last_used`` at most this often per key (seconds).
API_KEY_TOUCH_SECONDS = envint("API_KEY_TOUCH_SECONDS", 300)

#: Proxy limits.
MAX_REQUEST_BYTES = envint("MAX_REQUEST_BYTES", 32 * 1024 * 1024)
UPSTREAM_MAX_CONNECTIONS = envint("UPSTREAM_MAX_CONNECTIONS", 1000)
UPSTREAM_MAX_KEEPALIVE = envint("UPSTREAM_MAX_KEEPALIVE", 100)
#: Bound on an upstream's Retry-After that the relay honours (seconds).
RETRY_AFTER_MAX_SECONDS = envfloat("RETRY_AFTER_MAX_SECONDS", 10.0)
RETRY_BACKOFF_BASE_SECONDS = envfloat("RETRY_BACKOFF_BASE_SECONDS", 0.25)
#: Raw upstream body kept per attempt in the audit (bytes).
AUDIT_BODY_CAP = envint("AUDIT_BODY_CAP", 256 * 1024)

#: When set, ``GET /metrics`` requires ``Authorization: Bearer <METRICS_TOKEN>`` (it shows tenant
#: slugs and traffic); unset, keep /metrics off the public listener at the reverse proxy.
METRICS_TOKEN = envstr("METRICS_TOKEN")

REDIS_URL = envstr("REDIS_URL")
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL") or REDIS_URL
# With no broker, tasks run in process (eagerly); see docs/deployment.md.
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = False
CELERY_RESULT_BACKEND = None
CELERY_TASK_TIME_LIMIT = 30 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 25 * 60
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

INSTALLED_APPS = [
    "daphne",
    "config.admin_site.ToolrelayAdminConfig",  # django.contrib.admin with the branded site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_celery_beat",
    "tenants",
    "audit",
    "proxy",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
#: Serve admin static files from the ASGI app (fine for small installs; a reverse proxy can take over).
SERVE_STATIC = envbool("SERVE_STATIC", True)

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
    },
]


def _database() -> dict[str, Any]:
    default = f"sqlite:///{VAR_DIR / 'toolrelay.sqlite3'}"
    url = envstr("DATABASE_URL", default)
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=envint("DB_CONN_MAX_AGE", 60),
                                                            conn_health_checks=True))
    except Exception as exc:  # dj-database-url raises several types on malformed URLs
        raise ImproperlyConfigured(f"DATABASE_URL={url!r} is not a valid database URL: {exc}") from exc
    if config.get("ENGINE") == "django.db.backends.sqlite3":
        Path(str(config["NAME"])).parent.mkdir(parents=True, exist_ok=True)
        config["CONN_MAX_AGE"] = 0
        # WAL lets readers and a writer overlap; IMMEDIATE takes the write lock at BEGIN, so two
        # processes (Daphne and a Celery worker, or a test) wait for each other instead of failing
        # with "database is locked" on a read-to-write lock upgrade.
        config["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE",
                             "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
        # A file, not memory, so an end-to-end test's Daphne process sees the test database; one
        # per test process, so parallel runs in one tree do not share it.
        config["TEST"] = {"NAME": str(VAR_DIR / f"test-toolrelay-{os.getpid()}.sqlite3")}
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
#: Report files (``audit.Report``). Never served as static media: the admin streams them after its
#: tenant check. The web process and the Celery worker must share it (or set STORAGES to an object store).
MEDIA_ROOT = Path(envstr("MEDIA_ROOT", str(VAR_DIR / "media")))
MEDIA_URL = "media/"

SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("BEHIND_TLS_PROXY", False) else None

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

"""toolrelay settings: one module, driven by environment variables (see ``.env.example``).

Cross-setting invariants are checked as Django system checks in ``tenants/checks.py``; this module
only parses. Defaults give an embedded setup: SQLite in ``var/``, no broker (Celery tasks run in
process), a built-in simulated upstream wired by ``make run``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import envbool, envfloat, envint, envlist, envnetworks, envstr

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
#: How long a resolved API key / route stays in the in-process cache (seconds). Revocations and tenant
#: changes are broadcast (tenants.revocation) and drop the entry at once; this bounds how long a revoked
#: key keeps working only when the broadcast is lost (several processes and Redis down). A key in use is
#: re-read in the background once per half lifetime: at 5 s that was a database round trip on nearly every
#: request of a key used every few seconds, 4 ms CPU beside its upstream wait (docs/benchmarks.md).
AUTH_CACHE_SECONDS = envfloat("AUTH_CACHE_SECONDS", 30.0)
#: While the database cannot be asked, a key is served from its last good answer up to this old
#: (seconds; shared through Redis or JOURNAL_DIR/principals.json); unknown keys then get 503.
AUTH_STALE_SECONDS = envfloat("AUTH_STALE_SECONDS", 900.0)
#: Write ``ApiKey.last_used`` at most this often per key (seconds).
API_KEY_TOUCH_SECONDS = envint("API_KEY_TOUCH_SECONDS", 300)

#: Proxy limits. `manage.py serve` refuses a larger body with 413 as it arrives; the consumer checks
#: it again (for plain `daphne`, which buffers the whole body first).
MAX_REQUEST_BYTES = envint("MAX_REQUEST_BYTES", 32 * 1024 * 1024)
#: `manage.py serve` only (plain `daphne` ignores both): the listening socket's backlog (connections
#: accepted by the kernel, not yet by the process), and the seconds a request's line and headers may
#: take from its first byte before the connection is closed (slowloris; 0 turns it off).
LISTEN_BACKLOG = envint("LISTEN_BACKLOG", 1024)
HEADER_TIMEOUT_SECONDS = envfloat("HEADER_TIMEOUT_SECONDS", 10.0)
#: manage.py serve: how long a thread may hold the GIL before another runs (sys.setswitchinterval;
#: Python's default is 0.005). Shorter keeps the journal writer's batches from delaying the byte path.
GIL_SWITCH_INTERVAL_SECONDS = envfloat("GIL_SWITCH_INTERVAL_SECONDS", 0.0005)
UPSTREAM_MAX_CONNECTIONS = envint("UPSTREAM_MAX_CONNECTIONS", 1000)
UPSTREAM_MAX_KEEPALIVE = envint("UPSTREAM_MAX_KEEPALIVE", 100)
#: Fair shares of those connections, per process (proxy.upstreams.shares): a tenant's requests talking
#: to upstreams at once (more wait LIMITS_CONCURRENCY_WAIT_SECONDS, then 429 concurrency), and one
#: upstream's calls open at once (more wait as long, then fail as an unreachable upstream would).
#: The most bytes of one upstream body toolrelay reads, counted decoded (an upstream that compresses
#: although asked for identity is decoded in bounded pieces): past it the attempt ends as a broken
#: connection (proxy.upstreams.decoding).
UPSTREAM_MAX_BODY_BYTES = envint("UPSTREAM_MAX_BODY_BYTES", 256 * 1024 * 1024)
UPSTREAM_TENANT_CONNECTIONS = envint("UPSTREAM_TENANT_CONNECTIONS", 100)
UPSTREAM_UPSTREAM_CONNECTIONS = envint("UPSTREAM_UPSTREAM_CONNECTIONS", 500)
#: Bound on an upstream's Retry-After that the relay honours (seconds).
RETRY_AFTER_MAX_SECONDS = envfloat("RETRY_AFTER_MAX_SECONDS", 10.0)
RETRY_BACKOFF_BASE_SECONDS = envfloat("RETRY_BACKOFF_BASE_SECONDS", 0.25)
#: Networks upstream (and webhook, model-listing) connections may reach although the outbound
#: address policy (``infra.outbound``) refuses them: loopback, private, link-local, CGNAT, ...
#: Operators only (no tenant admin can change it). Empty: public addresses only.
UPSTREAM_ALLOW_NETWORKS = envnetworks("UPSTREAM_ALLOW_NETWORKS")
#: What an upstream was learned to refuse (proxy/upstreams/learned.py: an output budget over its range, a parameter it
#: refuses) holds this long (seconds; default 7 days), so a raised limit is noticed; with REDIS_URL every
#: process pulls what the others learned this often (seconds).
# Routing (docs/routing.md): circuits per upstream, cool-downs of pool keys.
ROUTING_CIRCUIT_FAILURES = envint("ROUTING_CIRCUIT_FAILURES", 3)
ROUTING_CIRCUIT_COOLDOWN_SECONDS = envfloat("ROUTING_CIRCUIT_COOLDOWN_SECONDS", 30.0)
ROUTING_KEY_COOLDOWN_SECONDS = envfloat("ROUTING_KEY_COOLDOWN_SECONDS", 30.0)
ROUTING_KEY_COOLDOWN_MAX_SECONDS = envfloat("ROUTING_KEY_COOLDOWN_MAX_SECONDS", 3600.0)
ROUTING_KEY_DISABLED_SECONDS = envfloat("ROUTING_KEY_DISABLED_SECONDS", 7 * 24 * 3600.0)
ROUTING_STATE_CACHE_SECONDS = envfloat("ROUTING_STATE_CACHE_SECONDS", 0.25)  # per process, of Redis reads
ROUTING_QUALITY_WINDOW_SECONDS = envfloat("ROUTING_QUALITY_WINDOW_SECONDS", 600.0)  # broken-turn rate window
ROUTING_QUALITY_EXPLORE = envfloat("ROUTING_QUALITY_EXPLORE", 0.1)  # share of new sessions sent to another target
ROUTING_QUALITY_CACHE_SECONDS = envfloat("ROUTING_QUALITY_CACHE_SECONDS", 1.0)  # per process, of the rates
UPSTREAM_LEARNED_TTL_SECONDS = envfloat("UPSTREAM_LEARNED_TTL_SECONDS", 7 * 24 * 3600.0)
UPSTREAM_LEARNED_SYNC_SECONDS = envfloat("UPSTREAM_LEARNED_SYNC_SECONDS", 5.0)
#: GET /v1/models also lists the default upstream's own models (its GET {base_url}/models), cached this long
#: per upstream (seconds; a failed listing is retried after a tenth of it), fetched with this timeout.
UPSTREAM_MODELS_CACHE_SECONDS = envfloat("UPSTREAM_MODELS_CACHE_SECONDS", 600.0)
UPSTREAM_MODELS_TIMEOUT_SECONDS = envfloat("UPSTREAM_MODELS_TIMEOUT_SECONDS", 3.0)
#: Requests that already passed through this many toolrelay proxies (x-toolrelay-hops) are refused with a
#: 400 (proxy/upstreams/hops.py): an upstream pointed back at toolrelay would otherwise chain requests without end.
MAX_PROXY_HOPS = envint("MAX_PROXY_HOPS", 1)
#: Longest SSE line read from an upstream (bytes): a longer one is a finding, never unbounded memory.
MAX_SSE_LINE_BYTES = envint("MAX_SSE_LINE_BYTES", 4 * 1024 * 1024)
#: Most upstream body bytes one guarded attempt may bring (the guard holds its calls until they are checked):
#: past it the attempt is broken and retried (finding upstream-body-too-large), never unbounded memory.
MAX_ATTEMPT_BYTES = envint("MAX_ATTEMPT_BYTES", 32 * 1024 * 1024)
#: Bounds on each tool's `parameters` JSON Schema, checked when a request arrives, before any upstream
#: call (proxy/guard/checks/schema_bounds.py); a schema past one gets a 400 naming it (code
#: tool_schema_too_complex). The defaults accept the tool sets of Claude Code, Codex CLI, OpenCode and
#: Qwen Code with a wide margin (tests/proxy/guard/test_schema_bounds.py prints their figures).
#: Nesting of the schema's JSON (levels; twice this many subschemas with $ref expanded).
SCHEMA_MAX_DEPTH = envint("SCHEMA_MAX_DEPTH", 32)
#: Compact JSON text of one schema (bytes) and its JSON values (nodes).
SCHEMA_MAX_BYTES = envint("SCHEMA_MAX_BYTES", 128 * 1024)
SCHEMA_MAX_NODES = envint("SCHEMA_MAX_NODES", 10_000)
#: Entries of one `enum`; subschemas of one anyOf / oneOf / allOf.
SCHEMA_MAX_ENUM = envint("SCHEMA_MAX_ENUM", 2_000)
SCHEMA_MAX_BRANCHES = envint("SCHEMA_MAX_BRANCHES", 128)
#: $ref expansions a validation can go through (counted along every path: nested combinators multiply).
SCHEMA_MAX_REFS = envint("SCHEMA_MAX_REFS", 1_000)
#: Static cost: schema nodes with every $ref expanded (an enum adds one per 8 entries). One validation
#: visits at most this many per JSON value of the arguments (~13 us each when every branch fails).
SCHEMA_MAX_COST = envint("SCHEMA_MAX_COST", 20_000)
#: The static costs of all of one request's tool schemas together (a recursive schema counts its nodes).
SCHEMA_MAX_REQUEST_COST = envint("SCHEMA_MAX_REQUEST_COST", 100_000)
#: A call whose estimate (static cost x JSON values of its arguments) is at most this is validated on the
#: event loop (~30 ms at worst); above it, in the validation pool. Recursive schemas always go there.
SCHEMA_INLINE_COST = envfloat("SCHEMA_INLINE_COST", 2_000.0)
#: New tool schemas of one request are checked against their metaschema on the event loop up to this many
#: JSON values together, smallest first (~0.05 ms per value for draft 7, ~0.4 ms for 2020-12); the rest in
#: the validation pool, where past the deadline the request gets a 400 (bound "check").
SCHEMA_INLINE_CHECK_NODES = envint("SCHEMA_INLINE_CHECK_NODES", 300)
#: The validation pool: worker processes (forkserver), and the time one validation may take (seconds)
#: before its worker is killed; the call then counts as invalid (finding schema-validation-unfinished).
SCHEMA_POOL_WORKERS = envint("SCHEMA_POOL_WORKERS", 2)
#: Checks of one tenant in the validation pool at once, per process (the others of that tenant wait their
#: turn within their deadline), so one tenant's fresh schemas cannot hold every worker.
SCHEMA_POOL_TENANT_SHARE = envint("SCHEMA_POOL_TENANT_SHARE", max(1, SCHEMA_POOL_WORKERS // 2))
SCHEMA_VALIDATION_DEADLINE_SECONDS = envfloat("SCHEMA_VALIDATION_DEADLINE_SECONDS", 2.0)
#: Compiled client schemas kept per process, bounded by their estimated memory (bytes; ~8 per byte of
#: schema text), least recently used first out.
SCHEMA_CACHE_BYTES = envint("SCHEMA_CACHE_BYTES", 64 * 1024 * 1024)
#: Raw upstream body kept per attempt in the audit (bytes).
AUDIT_BODY_CAP = envint("AUDIT_BODY_CAP", 256 * 1024)
#: The audit journal (audit/journal.py): one file per process in JOURNAL_DIR (a volume shared by the
#: processes of a host, so a restarted one drains what a dead one left); its backlog bound in bytes;
#: how often the writer moves it into the database and fsyncs it (seconds).
JOURNAL_DIR = envstr("JOURNAL_DIR", str(VAR_DIR / "journal"))
JOURNAL_MAX_BYTES = envint("JOURNAL_MAX_BYTES", 256 * 1024 * 1024)
JOURNAL_BATCH_SECONDS = envfloat("JOURNAL_BATCH_SECONDS", 0.5)
JOURNAL_FSYNC_SECONDS = envfloat("JOURNAL_FSYNC_SECONDS", 0.1)
JOURNAL_ORPHAN_SCAN_SECONDS = envfloat("JOURNAL_ORPHAN_SCAN_SECONDS", 30.0)
#: Where the journal writer runs (audit/journal_writer.py, docs/deployment.md): ``process`` (a child process of
#: ``manage.py serve``, restarted when it dies: the serving process does no database work for the audit),
#: ``external`` (no writer from serve: run ``manage.py journal_writer`` once per host), ``thread`` (in the
#: serving process, as before), ``auto`` (default: ``process`` with REDIS_URL, else ``thread``: without Redis
#: the live incident feed's channel layer is the serving process's memory, which another process cannot reach).
JOURNAL_WRITER = envstr("JOURNAL_WRITER", "auto")
#: With nothing to write, the writer checks the database this often (seconds) for /readyz.
JOURNAL_PING_SECONDS = envfloat("JOURNAL_PING_SECONDS", 5.0)
#: Client-side deadline of each database call made by the journal writer and the auth lookups
#: (a frozen database answers no server-side timeout).
DB_CALL_TIMEOUT_SECONDS = envfloat("DB_CALL_TIMEOUT_SECONDS", 5.0)
#: Upper bound on a whole client request (upstream's and route's own deadlines can only shorten it).
REQUEST_DEADLINE_SECONDS = envfloat("REQUEST_DEADLINE_SECONDS", 600.0)
#: The retry deadline: retries start only within this many seconds of the request's arrival, and a retry's
#: wait for its first byte ends with it: a stalling upstream holds a client this long at most, not N x its
#: timeout. (Not the tenant's retry budget, a share of its requests: ``RETRY_BUDGET_*`` below.) The
#: variable's old name ``RETRY_BUDGET_SECONDS`` is still read when the new one is not set.
RETRY_DEADLINE_SECONDS = envfloat("RETRY_DEADLINE_SECONDS", envfloat("RETRY_BUDGET_SECONDS", 120.0))
# Cut text streams continued (docs/routing.md, "Cut text streams continued"; a route's continue_text):
# at most this many continuations per request, and none once more than this many characters of text
# were delivered (the prefix is sent back upstream whole).
TEXT_CONTINUATIONS_MAX = envint("TEXT_CONTINUATIONS_MAX", 2)
TEXT_CONTINUATION_CAP_CHARS = envint("TEXT_CONTINUATION_CAP_CHARS", 256 * 1024)
#: Seconds a serving process charges with the prices it read before reading them again (billing.book).
BILLING_REFRESH_SECONDS = envfloat("BILLING_REFRESH_SECONDS", 30.0)
#: Output tokens a money budget reserves for a request that sets no max_tokens (proxy.policy.money).
BILLING_OUTPUT_ESTIMATE_TOKENS = envint("BILLING_OUTPUT_ESTIMATE_TOKENS", 256)
#: Percent of a money budget past which the tenant's alert fires, once per budget and window.
MONEY_SOFT_PERCENT = envfloat("MONEY_SOFT_PERCENT", 80.0)
#: The tenant retry budget's window (``GuardPolicy.retry_budget_percent``, ``proxy.policy.retry_budget``): seconds.
RETRY_BUDGET_WINDOW_SECONDS = envfloat("RETRY_BUDGET_WINDOW_SECONDS", 600.0)
#: Retries for broken output a tenant always has per window, whatever its share (a new tenant's first ones).
RETRY_BUDGET_MIN_RETRIES = envint("RETRY_BUDGET_MIN_RETRIES", 10)
#: How long the loop breaker remembers an agent session's steps after its last request (seconds).
LOOP_SESSION_TTL_SECONDS = envfloat("LOOP_SESSION_TTL_SECONDS", 3600.0)
#: On SIGTERM, ``manage.py serve`` stops accepting and lets open requests end for this long (keep it below
#: the orchestrator's stop grace period: compose's stop_grace_period is 60 s).
SHUTDOWN_GRACE_SECONDS = envfloat("SHUTDOWN_GRACE_SECONDS", 50.0)

#: The operator's webhook (infra/operator_alert.py): the web process posts to it when its audit journal stops
#: draining into the database and when it drains again (Postgres may be down: no Celery, no database).
#: Format ``slack`` ({"text": ...}) or ``generic`` (the alert's fields); signed with the secret when set.
ALERT_WEBHOOK_URL = envstr("ALERT_WEBHOOK_URL")
ALERT_WEBHOOK_SECRET = envstr("ALERT_WEBHOOK_SECRET")
ALERT_WEBHOOK_FORMAT = envstr("ALERT_WEBHOOK_FORMAT", "slack")
if ALERT_WEBHOOK_FORMAT not in ("slack", "generic"):
    raise ImproperlyConfigured(f"ALERT_WEBHOOK_FORMAT={ALERT_WEBHOOK_FORMAT!r}: expected slack or generic")
ALERT_WEBHOOK_TIMEOUT_SECONDS = envfloat("ALERT_WEBHOOK_TIMEOUT_SECONDS", 5.0)
#: Without a broker (no beat), `manage.py serve` evaluates the tenants' alert rules this often (seconds;
#: 0 turns it off). With a broker, beat runs them on the schedule `setup_schedules` registers.
ALERT_EVALUATE_SECONDS = envfloat("ALERT_EVALUATE_SECONDS", 60.0)

#: When set, ``GET /metrics`` requires ``Authorization: Bearer <METRICS_TOKEN>`` (it shows tenant
#: slugs and traffic); unset, keep /metrics off the public listener at the reverse proxy.
METRICS_TOKEN = envstr("METRICS_TOKEN")

REDIS_URL = envstr("REDIS_URL")
#: The prefix of every Redis name of this deployment (limits, leases and broadcasts, learned limits, last
#: good principals, the channel layer's groups, Celery's queues), so several deployments can share one
#: Redis. LIMITS_KEY_PREFIX is its older name for the same value.
REDIS_PREFIX = envstr("REDIS_PREFIX") or envstr("LIMITS_KEY_PREFIX", "toolrelay:")
#: The channel layer of the live incident feed: Redis (channels-redis) when REDIS_URL is set, so every
#: process's journal writer reaches every admin's WebSocket; else in process memory (one process).
CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                              "CONFIG": {"hosts": [REDIS_URL], "capacity": 500, "expiry": 30,
                                         "prefix": f"{REDIS_PREFIX}asgi"}}
                  if REDIS_URL else {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL") or REDIS_URL
#: Celery's Redis keys (queues, bindings, unacked sets) under the deployment's prefix (kombu >= 5.3).
CELERY_BROKER_TRANSPORT_OPTIONS = ({"global_keyprefix": REDIS_PREFIX}
                                   if CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")) else {})

# ----- limits (proxy.policy): shared state in Redis when REDIS_URL is set, else in process memory -----

#: Deadline of one Redis call of the limits (seconds); past it, or on any error, limits fail open.
LIMITS_REDIS_TIMEOUT_SECONDS = envfloat("LIMITS_REDIS_TIMEOUT_SECONDS", 0.05)
#: After a failed Redis call, no call is tried for this long (seconds): the circuit breaker.
LIMITS_REDIS_COOLDOWN_SECONDS = envfloat("LIMITS_REDIS_COOLDOWN_SECONDS", 2.0)
#: Prefix of every Redis key of the limits: the deployment's REDIS_PREFIX.
LIMITS_KEY_PREFIX = REDIS_PREFIX
#: A concurrency slot's lease: renewed by its process every third of this while the request runs, so a
#: slot held by a process that died frees itself within this many seconds.
LIMITS_LEASE_SECONDS = envfloat("LIMITS_LEASE_SECONDS", 30.0)
#: How long a request over its key's concurrency cap waits in the key's queue before a 429 (seconds).
LIMITS_CONCURRENCY_WAIT_SECONDS = envfloat("LIMITS_CONCURRENCY_WAIT_SECONDS", 2.0)
#: Wrong API keys one client address may send per minute before its wrong keys get 429 (valid keys
#: are never throttled). 0 turns the throttle off.
WRONG_KEY_LIMIT_PER_MINUTE = envint("WRONG_KEY_LIMIT_PER_MINUTE", 30)
# With no broker, tasks run in process (eagerly); see docs/deployment.md.
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = False
#: Without a broker, eager tasks run in background threads: at most this many at once (each may hold a
#: database connection); at most EAGER_TASK_QUEUE more wait, past that a task is not started (logged).
EAGER_TASK_WORKERS = envint("EAGER_TASK_WORKERS", 2)
EAGER_TASK_QUEUE = envint("EAGER_TASK_QUEUE", 100)
#: The admin's "send a test alert": at most one per webhook per ALERT_TEST_INTERVAL_SECONDS and
#: ALERT_TEST_PER_TENANT_PER_MINUTE per tenant.
ALERT_TEST_INTERVAL_SECONDS = envint("ALERT_TEST_INTERVAL_SECONDS", 10)
ALERT_TEST_PER_TENANT_PER_MINUTE = envint("ALERT_TEST_PER_TENANT_PER_MINUTE", 6)
CELERY_RESULT_BACKEND = None
CELERY_TASK_TIME_LIMIT = 30 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 25 * 60
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

INSTALLED_APPS = [
    "daphne",
    "tenants.admin_config.ToolrelayAdminConfig",  # django.contrib.admin with toolrelay's site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_celery_beat",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "tenants",
    "audit",
    "billing",
    "alerts",
    "proxy",
    "ninja",  # the management API's docs page (its bundled Swagger UI static files)
    "api",  # the self-service key page and the management REST API (django-ninja)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: turns a lockout into its 429 page
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
                "audit.context.journal_state",
            ],
        },
    },
]


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 (an empty file is an empty SQLite database, and SQLite gives its
    -wal / -shm files the database's mode), or take group and other bits off an existing one; never raises
    (``:memory:`` and paths it cannot touch are left alone)."""
    if str(path) in ("", ":memory:") or str(path).startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:
        pass


def _database() -> dict[str, Any]:
    default = f"sqlite:///{VAR_DIR / 'toolrelay.sqlite3'}"
    url = envstr("DATABASE_URL", default)
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=envint("DB_CONN_MAX_AGE", 60),
                                                            conn_health_checks=True))
    except Exception as exc:  # dj-database-url raises several types on malformed URLs
        raise ImproperlyConfigured(f"DATABASE_URL={url!r} is not a valid database URL: {exc}") from exc
    if config.get("ENGINE") == "django.db.backends.postgresql":
        # Bounds on a sick database, client side (audit/dbcall.py bounds each call on top): connecting,
        # and a peer that stops acknowledging (keepalives, tcp_user_timeout in ms).
        config["OPTIONS"] = {**config.get("OPTIONS", {}), "connect_timeout": envint("DB_CONNECT_TIMEOUT_SECONDS", 5),
                             "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                             "tcp_user_timeout": 10_000}
    if config.get("ENGINE") == "django.db.backends.sqlite3":
        Path(str(config["NAME"])).parent.mkdir(parents=True, exist_ok=True)
        _private_file(Path(str(config["NAME"])))
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
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": envint("PASSWORD_MIN_LENGTH", 12)}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# ----- admin login: throttling (django-axes), second factor (django-otp), single sign-on (OIDC) -----

#: One-time code on the admin login for users with a device; with this, superusers must have one.
ADMIN_OTP_REQUIRED_FOR_SUPERUSERS = envbool("ADMIN_OTP_REQUIRED_FOR_SUPERUSERS", False)
OTP_TOTP_ISSUER = "toolrelay"

#: Reverse proxies in front that append to X-Forwarded-For. 0 (default): the peer address
#: (REMOTE_ADDR) is the client; forwarded headers are never read, so they cannot be spoofed.
TRUSTED_PROXY_COUNT = envint("TRUSTED_PROXY_COUNT", 0)
AXES_FAILURE_LIMIT = envint("ADMIN_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=envint("ADMIN_LOGIN_COOLOFF_MINUTES", 15))
#: Locked out per account *and* address together (one address guessing one account), so nobody can lock
#: an admin out from elsewhere by knowing its user name; beside it, an address with
#: ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT failed logins (any accounts) within the cool-off is refused
#: altogether (tenants.admin_site).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT = envint("ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT", 20)
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_ENABLE_ADMIN = False  # tenants.admin_site registers its records read-only
AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if TRUSTED_PROXY_COUNT else ("REMOTE_ADDR",)
AXES_IPWARE_PROXY_COUNT = TRUSTED_PROXY_COUNT or None
AXES_IPWARE_PROXY_ORDER = "right-most"  # the entries our own proxies appended, not what the client sent

#: OpenID Connect single sign-on for the admin (mozilla-django-oidc): on when these are set.
OIDC_RP_CLIENT_ID = envstr("OIDC_RP_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = envstr("OIDC_RP_CLIENT_SECRET")
OIDC_OP_AUTHORIZATION_ENDPOINT = envstr("OIDC_OP_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = envstr("OIDC_OP_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = envstr("OIDC_OP_USER_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = envstr("OIDC_OP_JWKS_ENDPOINT")
OIDC_RP_SIGN_ALGO = envstr("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = envstr("OIDC_RP_SCOPES", "openid email profile")
#: New users from the identity provider are created without staff status: a superuser grants it.
OIDC_CREATE_USER = envbool("OIDC_CREATE_USER", True)
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID and OIDC_OP_AUTHORIZATION_ENDPOINT and OIDC_OP_TOKEN_ENDPOINT)

# ----- e-mail (Django's mail framework): invitations (tenants.services.invitation_mail) -----
#: The console backend (the message on the server's stdout) unless an SMTP server is configured, e.g.
#: ``django.core.mail.backends.smtp.EmailBackend``.
EMAIL_BACKEND = envstr("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = envstr("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", 25)
EMAIL_HOST_USER = envstr("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
#: Seconds an SMTP connection may take (an invitation is sent during the admin's request).
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "toolrelay <toolrelay@localhost>")

LOGIN_REDIRECT_URL = "/admin/"
LOGOUT_REDIRECT_URL = "/admin/login/"

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses locked-out accounts and addresses
    "django.contrib.auth.backends.ModelBackend",
    *(["tenants.oidc.ToolrelayOIDCBackend"] if OIDC_ENABLED else []),  # matched on a stored subject
]
if OIDC_ENABLED:
    INSTALLED_APPS.append("mozilla_django_oidc")

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
#: How often an open live incident feed re-checks its session and memberships (seconds): a logout, a
#: deactivation or a removed membership closes it within this long.
LIVE_FEED_RECHECK_SECONDS = envfloat("LIVE_FEED_RECHECK_SECONDS", 10.0)
#: Report and export files hold tenants' data: readable by toolrelay's user only.
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700

#: Behind a TLS-terminating reverse proxy: trust its X-Forwarded-Proto, send HSTS, Secure cookies.
BEHIND_TLS_PROXY = envbool("BEHIND_TLS_PROXY", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if BEHIND_TLS_PROXY else None
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", BEHIND_TLS_PROXY)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", BEHIND_TLS_PROXY)
#: HSTS on HTTPS responses (SecurityMiddleware sends it only on secure requests).
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if BEHIND_TLS_PROXY else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
#: Admin sessions end after this many seconds (Django's default is 14 days).
SESSION_COOKIE_AGE = envint("SESSION_COOKIE_AGE", 12 * 3600)
SESSION_COOKIE_HTTPONLY = True
SECURE_REFERRER_POLICY = "same-origin"

def _ws_origin(url: str) -> str:
    """The WebSocket origin of ``url`` (``http://h:p/x`` -> ``ws://h:p``)."""
    scheme, _, rest = url.partition("://")
    return ("wss" if scheme == "https" else "ws") + "://" + rest.split("/", 1)[0]


#: Content Security Policy (django-csp) for every Django page: no inline script or style without
#: the per-response nonce, no plugins, no framing, forms post only here.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [NONE],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
        # The live incident feed's WebSocket: 'self' covers ws(s):// to this origin in CSP 3 browsers; the
        # SITE_URL's own ws(s) origin is named for the others.
        "connect-src": [SELF, _ws_origin(SITE_URL)],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # LOG_FORMAT=json: one JSON object per line; either way a request's lines carry its request and trace ids
    # (infra.logcontext).
    "formatters": {"plain": {"()": "infra.logcontext.PlainFormatter"},
                   "json": {"()": "infra.logcontext.JsonFormatter"}},
    "filters": {"context": {"()": "infra.logcontext.ContextFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["context"],
                             "formatter": "json" if envstr("LOG_FORMAT", "plain").lower() == "json" else "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    # httpx logs every request URL at INFO (a URL may carry what must not be logged).
    "loggers": {"django.channels.server": {"level": "WARNING"}, "httpx": {"level": "WARNING"},
                "httpcore": {"level": "WARNING"}},
}

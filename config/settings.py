"""tailtune settings: one module, driven by the environment.

Unset, ``DATABASE_URL`` and ``CELERY_BROKER_URL`` give the embedded defaults
(SQLite in WAL mode and kombu's filesystem transport under ``TAILTUNE_DATA``),
so one machine runs web and worker with no server installed. A ``postgres://``
and a ``redis://`` URL select the real services.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE

from config.clientip import trusted_networks
from config.env import ImproperEnv, envbool, envint, envlist, envpaths, envstr, envurls
from config.secretfiles import create_secret_file, read_secret_file

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("TAILTUNE_DATA", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = envbool("DEBUG", False)


def _secret_key() -> str:
    key = envstr("SECRET_KEY")
    if key:
        return key
    if envstr("DATABASE_URL").startswith("postgres"):
        # A shared database means a real deployment: its key must be given.
        raise ImproperEnv("SECRET_KEY must be set when DATABASE_URL points at a shared database")
    # Generated once, born 0600 with its whole content, never through a planted link (config/secretfiles.py).
    path = DATA_DIR / "secret_key"
    try:
        create_secret_file(path, secrets.token_urlsafe(50))
    except FileExistsError:
        pass  # made earlier, or by a process that started beside this one: that key is the key
    try:
        key = read_secret_file(path).strip()
    except OSError as exc:
        raise ImproperEnv(
            f"{path}: cannot read the secret key ({exc.strerror}); it must be a plain file"
        ) from None
    if not key:
        raise ImproperEnv(f"{path} is empty: remove it to have a new key made, or set SECRET_KEY")
    return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "apps.audit",
    "apps.accounts",
    "apps.api",
    "apps.experiments",
    "apps.workloads",
    "apps.runs",
    "apps.analysis",
    "apps.search",
    "apps.lifecycle",
    "apps.approvals",
    "apps.gate",
    "apps.notifications",
    "apps.history",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A body over what any request may send is a 413 before it is read (config/bodylimits.py).
    "config.bodylimits.BodyLimitsMiddleware",
    # Static files from the web process itself, compressed, with cache headers (whitenoise).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A NUL character in the path, the query or a page's form is a 400 naming it (config/params.py).
    "config.params.RefuseNulCharacters",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every response (django-csp; the policy is CONTENT_SECURITY_POLICY).
    "csp.middleware.CSPMiddleware",
    "apps.accounts.middleware.LoginRequiredEverywhere",
    # Last, as its documentation asks: turns a locked-out login into a 429 page.
    "axes.middleware.AxesMiddleware",
]

# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one username from one
# address, that pair is locked out for AXES_COOLOFF_TIME hours; every attempt is recorded.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = envint("AXES_COOLOFF_HOURS", 1)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Axes records attempts in the database (AXES_HANDLER's default), which every web process shares.
# The client's address: the peer, or X-Forwarded-For as far as TAILTUNE_TRUSTED_PROXIES (a comma
# list of addresses or CIDR networks; unset: none) vouch for it. One function for axes and the API.
TAILTUNE_TRUSTED_PROXIES = envlist("TAILTUNE_TRUSTED_PROXIES", [])
try:
    trusted_networks(tuple(TAILTUNE_TRUSTED_PROXIES))
except ValueError as _exc:
    raise ImproperEnv(f"TAILTUNE_TRUSTED_PROXIES: {_exc}") from None
AXES_CLIENT_IP_CALLABLE = "config.clientip.client_ip"

ROOT_URLCONF = "config.urls"
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
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"


def _sqlite(name: str | Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        # WAL lets the web process read while the worker writes; the timeout
        # rides out the short write locks between them.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not memory, so a worker process started by a test sees the test database.
        # Per test process, so two test runs on one machine never share a file.
        "TEST": {"NAME": str(DATA_DIR / f"test-tailtune-{os.getpid()}.sqlite3")},
    }


def _database() -> dict[str, Any]:
    url = envstr("DATABASE_URL")
    if not url:
        return _sqlite(DATA_DIR / "tailtune.sqlite3")
    if url.startswith("sqlite:///"):
        # sqlite:////abs/path or sqlite:///relative/path
        return _sqlite(url.removeprefix("sqlite:///"))
    if not url.startswith(("postgres://", "postgresql://")):
        raise ImproperEnv(f"DATABASE_URL={url!r}: only postgres:// (or sqlite:///) URLs are supported")
    db: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=envint("DB_CONN_MAX_AGE", 60)))
    db["CONN_HEALTH_CHECKS"] = True
    return db


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Uploads (config/uploadhandlers.py) --------------------------------------
# Every uploaded file streams to a temporary file on the data volume, capped while it arrives;
# the rest of a request body (form fields, JSON) is capped by Django itself. A trace uploaded
# with a new experiment is then imported by a worker (apps/lifecycle/trace_upload.py).
TAILTUNE_MAX_UPLOAD_BYTES = envint("TAILTUNE_MAX_UPLOAD_BYTES", 512 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("TAILTUNE_MAX_REQUEST_BYTES", 8 * 1024 * 1024)
# A request carries at most this many files (the create page sends two) and form fields (Django's
# default); more is a 413 naming the limit (config/bodylimits.py), as is a body declared larger
# than these allow, before it is read.
DATA_UPLOAD_MAX_NUMBER_FILES = envint("TAILTUNE_MAX_REQUEST_FILES", 4)
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
FILE_UPLOAD_HANDLERS = ["config.uploadhandlers.CappedTemporaryFileUploadHandler"]
FILE_UPLOAD_TEMP_DIR = str(DATA_DIR / "uploads" / "tmp")
Path(FILE_UPLOAD_TEMP_DIR).mkdir(parents=True, exist_ok=True)

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# `manage.py serve` runs collectstatic (which also writes gzip copies) before the web server starts;
# whitenoise then serves the collected files. Until a first collectstatic (tests, a fresh checkout)
# it serves straight from the static folders.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = not any(STATIC_ROOT.iterdir())
# plotly.js comes from the installed package under a versioned folder (apps/experiments/staticfiles.py):
# a new version is a new URL, so it is cached for a year.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "apps.experiments.staticfiles.PlotlyFinder",
]
WHITENOISE_IMMUTABLE_FILE_TEST = r"/vendor/plotly-[^/]+/"

# --- Behind a TLS-terminating proxy (docs: README "Production") ------------
# TAILTUNE_HTTPS=true: cookies only over HTTPS, HSTS, and redirects to HTTPS, trusting the proxy's
# X-Forwarded-Proto header. Off on the embedded defaults, which serve plain HTTP on 127.0.0.1.
HTTPS = envbool("TAILTUNE_HTTPS", False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
# Asking browsers to preload HSTS binds every subdomain of the domain to HTTPS for as long as the
# lists take to drop it (months): the operator opts in with TAILTUNE_HSTS_PRELOAD=true. Off, the
# deploy check's reminder about it (security.W021) is silenced, since that is the choice made.
SECURE_HSTS_PRELOAD = HTTPS and envbool("TAILTUNE_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy (django-csp): everything from this origin only; no inline script, no
# eval, no plugin, no framing, forms post here only. Pages load their scripts from static files
# (templates/ and static/ hold no inline script or on* handler: tests/foundation/test_csp.py).
# Styles may be inline: plotly.js inserts its stylesheet as a <style> element and the class
# swatches are style attributes; a style cannot run script. img-src allows data: URIs, which
# the API docs' (Swagger UI's) stylesheet uses for its icons.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# --- Celery ---------------------------------------------------------------
# The hard limit bounds one run (warm-up + observation + drain + start/stop);
# the broker must not redeliver a task that is still legitimately running, so
# its visibility timeout sits above the hard limit.
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 4 * 3600)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 120
_VISIBILITY_TIMEOUT = CELERY_TASK_TIME_LIMIT + 3600

_broker = envstr("CELERY_BROKER_URL")
if _broker:
    if not _broker.startswith(("redis://", "rediss://", "filesystem://", "memory://")):
        raise ImproperEnv(f"CELERY_BROKER_URL={_broker!r}: expected a redis:// URL")
    CELERY_BROKER_URL = _broker
    CELERY_RESULT_BACKEND = envstr("CELERY_RESULT_BACKEND", _broker if _broker.startswith("redis") else "")
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {"visibility_timeout": _VISIBILITY_TIMEOUT}
else:
    _queue_dir = DATA_DIR / "broker"
    _results_dir = DATA_DIR / "results"
    for _d in (_queue_dir, _queue_dir / "processed", _queue_dir / "control", _results_dir):
        _d.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    # Web and worker read and write the same folder: that is the whole broker.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_queue_dir / "processed"),
        # Broadcast (remote control) exchanges; kombu's default is ./control.
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
        "visibility_timeout": _VISIBILITY_TIMEOUT,
    }
    CELERY_RESULT_BACKEND = envstr("CELERY_RESULT_BACKEND", f"file://{_results_dir}")

# --- The shared cache ------------------------------------------------------
# What every process must count alike (failed API authentications, apps/api/auth.py) lives in one
# cache, never in a process's memory: Redis at TAILTUNE_CACHE_URL, else at a redis://
# CELERY_BROKER_URL (its keys beside the broker's, under their own prefix), else a folder under
# TAILTUNE_DATA that every process of this machine shares. TAILTUNE_CACHE_PREFIX keeps the keys of
# services that share one Redis apart.
# The test suite's lanes (pytest-xdist workers) share one Redis as they share one Postgres server:
# each keeps its own keys, as each has its own database (a TAILTUNE_CACHE_PREFIX given is used whole).
_LANE = f"-{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else ""
_redis_broker = _broker if _broker.startswith(("redis://", "rediss://")) else ""
_cache_url = envstr("TAILTUNE_CACHE_URL") or _redis_broker
if _cache_url:
    if not _cache_url.startswith(("redis://", "rediss://")):
        raise ImproperEnv(f"TAILTUNE_CACHE_URL={_cache_url!r}: expected a redis:// URL")
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _cache_url,
            "KEY_PREFIX": envstr("TAILTUNE_CACHE_PREFIX") or f"tailtune{_LANE}",
            "OPTIONS": {"socket_connect_timeout": 5, "socket_timeout": 5},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(DATA_DIR / "cache"),
            "KEY_PREFIX": envstr("TAILTUNE_CACHE_PREFIX", "tailtune"),
        }
    }

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Tests give their workers a queue of their own, so no other worker takes their tasks.
CELERY_TASK_DEFAULT_QUEUE = envstr("TAILTUNE_DEFAULT_QUEUE", "default")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)

# --- The engine ----------------------------------------------------------
# Where `make engine` puts the CPU vLLM environment and the tiny local model.
ENGINE_DIR = Path(envstr("TAILTUNE_ENGINE_DIR", str(BASE_DIR / ".engine"))).resolve()
# The name of the host this worker serves (its queue is "host.<name>").
TAILTUNE_HOST = envstr("TAILTUNE_HOST", "local-cpu")
# The directories a model path may lie under (docs/SPEC.md, "model"): the spec's check, the
# create page and the worker's launcher refuse anything else. Unset: the CPU engine's models and
# TAILTUNE_DATA/models (not the whole of TAILTUNE_DATA, which holds the secret key and database).
TAILTUNE_MODEL_ROOTS = envpaths(
    "TAILTUNE_MODEL_ROOTS", [str(ENGINE_DIR / "models"), str(DATA_DIR / "models")]
)
# This host's servers trace each request to the worker (per-request queue, prefill and decode
# times, workers/engine/spans.py); false for an engine that cannot reach the worker's loopback.
TAILTUNE_SERVER_SPANS = envbool("TAILTUNE_SERVER_SPANS", True)
# The running vLLM servers B0 may be captured from on the create page and through the API, by
# name (docs/SPEC.md, "Capturing B0"): a JSON object, name -> base URL. A user picks a name, never
# a URL; `manage.py baseline_capture --url` is the operator's and takes any.
TAILTUNE_CAPTURE_SOURCES = envurls("TAILTUNE_CAPTURE_SOURCES")
# How many pasted captures vLLM's parser reads at once (each holds a request 15-35 s on a CPU
# host); more get "try again" (429 from the API). apps/approvals/capture_sources.py.
TAILTUNE_CAPTURE_PARSES = envint("TAILTUNE_CAPTURE_PARSES", 1)
# Caps on one experiment's plan, checked when a spec is validated (docs/SPEC.md, "Limits").
TAILTUNE_MAX_RUNS = envint("TAILTUNE_MAX_RUNS", 10_000)
TAILTUNE_MAX_ENGINE_HOURS = envint("TAILTUNE_MAX_ENGINE_HOURS", 2_000)
# How long a class's validators may take when an experiment is analysed (apps/analysis/validators.py):
# one probe answer, and every answer of one analysis together. Past either, the answer fails the
# validator with that reason; the analysis (on a worker, never in a web request) goes on.
TAILTUNE_VALIDATOR_ANSWER_MS = envint("TAILTUNE_VALIDATOR_ANSWER_MS", 1_000)
TAILTUNE_VALIDATOR_EXPERIMENT_S = envint("TAILTUNE_VALIDATOR_EXPERIMENT_S", 120)
for _name in ("TAILTUNE_VALIDATOR_ANSWER_MS", "TAILTUNE_VALIDATOR_EXPERIMENT_S"):
    if globals()[_name] <= 0:
        raise ImproperEnv(f"{_name}={globals()[_name]} must be a positive integer")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # A refused request (403, 404, ...) is one line, not a traceback: it is the client's error.
    "filters": {"client_errors_one_line": {"()": "config.logfilters.ClientErrorsOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["client_errors_one_line"]}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}


# The REST API (apps/api): Django REST framework, bearer tokens only (no session, so no CSRF
# for API clients), OpenAPI 3 by drf-spectacular with its Swagger UI served from this
# process (the sidecar package: no CDN).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["apps.api.auth.TokenAuthentication"],
    # A token's scope for the method (apps/api/auth.py TokenScope), after its user's authentication.
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "apps.api.auth.TokenScope",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # ?format= is the records endpoint's own parameter (json or jsonl), not content negotiation.
    "URL_FORMAT_OVERRIDE": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "tailtune API",
    "DESCRIPTION": "Experiments, their reports, approvals and rollback manifests. "
    "Authenticate with `Authorization: Bearer <token>` (create one on /accounts/tokens/).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}
# Failed API authentications per client address before it is refused (429) for the window.
API_AUTH_FAILURE_LIMIT = int(os.environ.get("TAILTUNE_API_AUTH_FAILURE_LIMIT", "20"))
API_AUTH_FAILURE_WINDOW_S = 300
# Every API token expires: this many days after it is made unless made shorter (apps/accounts/tokens.py).
TAILTUNE_TOKEN_DAYS = envint("TAILTUNE_TOKEN_DAYS", 90)
if TAILTUNE_TOKEN_DAYS < 1:
    raise ImproperEnv(f"TAILTUNE_TOKEN_DAYS={TAILTUNE_TOKEN_DAYS}: a token must live at least 1 day")

# The address people reach this server at: the gate's reports link to experiment pages with it
# (`manage.py gate` on the server; through the API, the request's own address is used).
PUBLIC_URL = envstr("TAILTUNE_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# Notifications (apps/notifications): email through Django's own mail settings, and webhooks the
# operator names here as JSON, name -> URL ({"ops": "https://hooks.example/tailtune"}). A user
# picks webhooks by name on /notifications/; no user or spec ever gives a URL.
TAILTUNE_WEBHOOKS = envurls("TAILTUNE_WEBHOOKS")
EMAIL_HOST = envstr("EMAIL_HOST", "")
EMAIL_PORT = envint("EMAIL_PORT", 25)
EMAIL_HOST_USER = envstr("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "tailtune@localhost")
# No mail server configured: mail is written to the worker's log instead of being lost to a
# connection refused on localhost:25.
EMAIL_BACKEND = envstr(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
# An experiment that has not moved for this long is looked at by the reconciler (apps/lifecycle/reconcile.py).
RECONCILE_AFTER_S = envint("TAILTUNE_RECONCILE_AFTER_S", 300)

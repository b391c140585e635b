"""Settings, read from the environment.

APPROVALS_ENV=production refuses to start without real secrets; development (the default)
generates them into a git-ignored file on first run.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.env import (
    DEV_SECRETS,
    database_from_url,
    development_public_url,
    env_bool,
    env_int,
    env_list,
    env_str,
    env_url,
    load_dev_secrets,
    oidc_origin,
    oidc_providers,
    parse_encryption_keys,
    parse_signing_key,
    sqlite_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent

APPROVALS_ENV = env_str("APPROVALS_ENV", "development")
if APPROVALS_ENV not in {"development", "production"}:
    raise ImproperlyConfigured(
        f"APPROVALS_ENV={APPROVALS_ENV!r} must be 'development' or 'production'"
    )
PRODUCTION = APPROVALS_ENV == "production"

if PRODUCTION:
    for required in (*DEV_SECRETS, "DJANGO_ALLOWED_HOSTS", "APPROVALS_PUBLIC_URL"):
        if not os.environ.get(required):
            raise ImproperlyConfigured(f"{required} must be set when APPROVALS_ENV=production")
    _dev_secrets: dict[str, str] = {}
else:
    _dev_secrets = (
        {}
        if all(os.environ.get(name) for name in DEV_SECRETS)
        else load_dev_secrets(BASE_DIR / ".dev-keys.env")
    )

SECRET_KEY = env_str("DJANGO_SECRET_KEY") or _dev_secrets["DJANGO_SECRET_KEY"]
DEBUG = env_bool("DJANGO_DEBUG", default=not PRODUCTION)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # allauth's two-factor pages use its filters.
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "channels",
    "django_tasks",
    "django_tasks_db",
    "axes",
    # Accounts (django-allauth): local passwords, single sign-on with OpenID Connect,
    # two-factor (TOTP, recovery codes, passkeys) and each person's list of sessions.
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.mfa",
    "allauth.usersessions",
    "approvals",
    "accounts",
    "sessions_admin",
    "notifications",
    "api",
]
# Test, benchmark and demo tooling (devtools/): never installed in production.
if not PRODUCTION:
    INSTALLED_APPS.append("devtools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "allauth.usersessions.middleware.UserSessionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "approvals.middleware.SecurityHeadersMiddleware",
    "approvals.middleware.DatabaseUnavailableMiddleware",
    "approvals.middleware.UnstorableValueMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into a clear 429 page.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

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
                "approvals.context_processors.console",
            ],
        },
    },
]

_database_url = env_str("DATABASE_URL")
DATABASES = {
    # Pooled PostgreSQL connections per process (0: a new connection for each request/task),
    # which prepare the statements they run again (off for an old PgBouncer: docs/DEPLOY.md).
    "default": database_from_url(
        _database_url,
        base_dir=BASE_DIR,
        pool_size=env_int("DATABASE_POOL_SIZE", 8),
        prepared_statements=env_bool("DATABASE_PREPARED_STATEMENTS", default=True),
    )
    if _database_url
    else sqlite_database(BASE_DIR / "db.sqlite3")
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
CHANNEL_LAYERS = {
    "default": {
        # Live hints are said once and may be lost (a page re-reads on reconnect and polls, and
        # a socket re-reads its user's session and memberships every
        # APPROVALS_LIVE_RECHECK_SECONDS): Redis pub/sub carries each in one PUBLISH, where the
        # list-based layer spent four round trips (the group's expiry and members, each
        # channel's expiry, a script adding the message to each channel) on every hint. Groups
        # are the processes' own subscriptions.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 15,
                    "socket_connect_timeout": 3,
                    # A subscription's connection is idle between hints: a PING when it has been
                    # quiet this long, and TCP keepalives, find a connection that died without
                    # a word (a NAT or a proxy dropping it), so it reconnects and subscribes again.
                    "health_check_interval": 30,
                    "socket_keepalive": True,
                }
            ]
        },
    }
    if REDIS_URL
    else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
}

# The cache: the API's rate limit and usage counts (api.tokens) and cached chain checks. Shared
# between processes through Redis when REDIS_URL is set; per process otherwise.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "approvals",
    }
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        # default: resumes and starts; notifications: webhook and email deliveries, served by
        # their own pool of `manage.py worker` so a hanging receiver never holds up a resume.
        "QUEUES": ["default", "notifications"],
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "static"

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# --- Accounts (django-allauth; accounts/, docs/DEPLOY.md "Sign-in") ---------------------------
# People sign in by username; nobody signs up: a local account is made by an admin (or an
# invitation), an SSO account only by an invitation or a group mapped to a role (accounts.sso).
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "email", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_ADAPTER = "accounts.adapters.AccountAdapter"
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_SESSION_REMEMBER = None
# django-axes keeps the lockout (five failures, fifteen minutes): allauth's own limit on failed
# sign-ins would answer first with another page, so it is off. Its limit on sign-ins per address
# stays, raised from 30 a minute: a whole office behind one address signs in at nine.
ACCOUNT_RATE_LIMITS = {
    "login_failed": False,
    "login": env_str("APPROVALS_SIGN_IN_RATE", "300/m/ip"),
}
ACCOUNT_REAUTHENTICATION_TIMEOUT = 300
ACCOUNT_EMAIL_NOTIFICATIONS = False
SOCIALACCOUNT_ADAPTER = "accounts.adapters.SocialAccountAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_LOGIN_ON_GET = False
SOCIALACCOUNT_STORE_TOKENS = False
SOCIALACCOUNT_ONLY = False
# OpenID Connect providers from the environment (config.env.oidc_providers): Okta, Entra ID,
# Google Workspace, Keycloak... each with its issuer, client id and secret.
SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"APPS": oidc_providers()}}
# The "Sign in with ..." forms are redirected to the providers: CSP form-action allows them.
CSP_FORM_ACTION_ORIGINS = sorted(
    {oidc_origin(app) for app in SOCIALACCOUNT_PROVIDERS["openid_connect"]["APPS"]}
)
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes", "webauthn"]
MFA_PASSKEY_LOGIN_ENABLED = True
# The console never signs anyone in or resets anything by e-mail (no verification, no reset by
# mail), so an address not verified is no risk to a second factor: anyone may add one.
MFA_ALLOW_UNVERIFIED_EMAIL = True
MFA_TOTP_ISSUER = env_str("APPROVALS_TOTP_ISSUER", "Approval console")
# Passkeys are bound to the console's origin; plain http is allowed on loopback in development.
MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = not PRODUCTION
MFA_ADAPTER = "accounts.adapters.MFAAdapter"
# Sessions are recorded at sign-in; tracking each request would cost queries on every page.
USERSESSIONS_TRACK_ACTIVITY = False

# Sign-in brute force: five failures for one username from one address lock it for 15 minutes.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

# Django's database sessions, the read every signed-in request makes written once per process.
SESSION_ENGINE = "approvals.core.session_store"
SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"openai.agents": {"level": "WARNING"}},
}

# --- The approval console -------------------------------------------------------------------

APPROVALS_ENCRYPTION_KEYS = parse_encryption_keys(
    env_str("APPROVALS_ENCRYPTION_KEYS") or _dev_secrets["APPROVALS_ENCRYPTION_KEYS"]
)
# The audit chain's HMAC-SHA256 keys (approvals.core.signatures): the first links new events,
# all verify. Never stored in the database; a retired key stays here as long as the events it
# linked must verify (docs/AUDIT.md).
APPROVALS_AUDIT_KEYS = parse_encryption_keys(
    env_str("APPROVALS_AUDIT_KEYS") or _dev_secrets["APPROVALS_AUDIT_KEYS"],
    name="APPROVALS_AUDIT_KEYS",
    algorithm="HMAC-SHA256",
)
# The Ed25519 private key that signs audit checkpoints (manage.py audit_checkpoint).
APPROVALS_AUDIT_SIGNING_KEY = parse_signing_key(
    env_str("APPROVALS_AUDIT_SIGNING_KEY") or _dev_secrets["APPROVALS_AUDIT_SIGNING_KEY"]
)
# The Ed25519 private keys that sign the decisions a caller fetches for a run it resumes itself
# (approvals.core.signatures.sign_decision): the first signs, every one is published
# (GET /api/v1/keys), so a new key goes first and the old one stays until no caller needs it.
APPROVALS_DECISION_SIGNING_KEYS = parse_encryption_keys(
    env_str("APPROVALS_DECISION_SIGNING_KEYS") or _dev_secrets["APPROVALS_DECISION_SIGNING_KEYS"],
    name="APPROVALS_DECISION_SIGNING_KEYS",
    algorithm="Ed25519",
)

# agent key -> version -> dotted path of a factory (no required arguments) that builds the
# top-level agent. A version, once deployed, keeps its tool names, schemas and handoffs.
APPROVALS_AGENTS: dict[str, dict[str, str | dict[str, str]]] = {}
# The demo agents (devtools/demo.py), in development only (and so in tests): production
# starts with none.
if APPROVALS_ENV == "development":
    APPROVALS_AGENTS |= {
        "release": {
            "1": {
                "factory": "devtools.demo.build_release_agent",
                "context_serializer": "devtools.demo.release_context_serializer",
                "context_deserializer": "devtools.demo.release_context_deserializer",
                # A deploy is compared with the last approved deploy to the same environment.
                "targets": {"deploy_release": ["environment"]},
            }
        },
        # Every invoice is its own: one is compared with the last invoice published.
        "invoice": {
            "1": {
                "factory": "devtools.demo.build_invoice_agent",
                "targets": {"publish_invoice": []},
            }
        },
    }

APPROVALS_TICKET_TTL = timedelta(seconds=env_int("APPROVALS_TICKET_TTL_SECONDS", 86400, minimum=60))
APPROVALS_LEASE_SECONDS = env_int("APPROVALS_LEASE_SECONDS", 60, minimum=2)
# The reaper also applies ticket expiry actions (reject, escalate), so it runs often.
APPROVALS_REAPER_INTERVAL_SECONDS = env_int("APPROVALS_REAPER_INTERVAL_SECONDS", 5, minimum=1)
APPROVALS_RESUME_GRACE_SECONDS = env_int("APPROVALS_RESUME_GRACE_SECONDS", 300)
APPROVALS_MAX_ATTEMPTS = env_int("APPROVALS_MAX_ATTEMPTS", 5, minimum=1)
# With the in-memory channel layer, each web process reads new audit events this often.
APPROVALS_LIVE_POLL_SECONDS = 0.5
# An open live socket re-reads its user's memberships and whether its session still exists this
# often, whatever it was told: a lost sign-out or membership message holds at most this long.
APPROVALS_LIVE_RECHECK_SECONDS = env_int("APPROVALS_LIVE_RECHECK_SECONDS", 60, minimum=1)
# Agent sessions: SQLite files are <dir>/<tenant>.sqlite3; Redis keys live under <prefix>:<tenant>.
APPROVALS_SQLITE_SESSION_DIR = Path(
    env_str("APPROVALS_SQLITE_SESSION_DIR", str(BASE_DIR / "var" / "sessions"))
)
APPROVALS_REDIS_SESSION_PREFIX = env_str("APPROVALS_REDIS_SESSION_PREFIX", "agents:session")
APPROVALS_SESSION_OPENERS = {"django": "sessions_admin.orm_session.open_for_console"}
APPROVALS_DEMO_EFFECT_LOG = Path(
    env_str("APPROVALS_DEMO_EFFECT_LOG", str(BASE_DIR / "var" / "demo-effects.log"))
)

# Where people reach the console, path prefix included: every absolute link (emails, webhook
# payloads, the API's `url` fields, bin/run-dev's banner). Production names it; development
# follows where bin/run-dev serves (HOST, PORT) unless it is set.
APPROVALS_PUBLIC_URL = env_url(
    "APPROVALS_PUBLIC_URL",
    ""
    if PRODUCTION
    else development_public_url(
        host=env_str("HOST", "127.0.0.1"), port=env_int("PORT", 8000, minimum=1)
    ),
)

# The HTTP API (api): requests per token per minute (fixed windows of the clock, in the cache),
# and how often a long poll (GET /api/v1/runs/N?wait=) re-reads the run's status.
APPROVALS_API_RATE_PER_MINUTE = env_int("APPROVALS_API_RATE_PER_MINUTE", 600, minimum=1)
APPROVALS_API_WAIT_POLL_SECONDS = 0.5

# Notification email. Development prints messages to the console; set EMAIL_BACKEND to
# django.core.mail.backends.smtp.EmailBackend (with EMAIL_HOST, ...) to send them.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "approvals@localhost")

# Webhooks to private, loopback, link-local and other non-public addresses (SSRF guard): allowed
# in development, where the demo receiver listens on 127.0.0.1:$WEBHOOK_PORT (8025); refused in
# production.
NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = env_bool(
    "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS", default=not PRODUCTION
)

OPENAI_API_KEY = env_str("OPENAI_API_KEY")
APPROVALS_OPENAI_MODEL = env_str("APPROVALS_OPENAI_MODEL", "gpt-4.1-mini")
# Another endpoint for the OpenAI API (a proxy, or a local fake in tests).
APPROVALS_OPENAI_BASE_URL = env_str("OPENAI_BASE_URL")

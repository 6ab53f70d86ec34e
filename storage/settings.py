"""Settings of the storage subsystem: the SQL database and the object store.

Built at the entry point (CLI, flow) and passed down; never read at import. Secrets are
`SecretStr` and URLs are shown redacted, so neither reaches logs, reprs or errors.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from core.home import epiflow_home


def default_database_url() -> SecretStr:
    """`sqlite:///$EPIFLOW_HOME/epiflow.db` (an absolute path: the same file from any
    working directory)."""
    return SecretStr(f"sqlite:///{epiflow_home() / 'epiflow.db'}")


def default_objects_url() -> str:
    """`$EPIFLOW_HOME/objects`."""
    return str(epiflow_home() / "objects")


SUPPORTED_BACKENDS = ("postgresql", "sqlite")
"""The SQL databases epiflow's schema, migrations and queries are written for."""


class DatabaseSettings(BaseSettings):
    """Where episode metadata lives. SQLite by default; PostgreSQL in production."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_DATABASE_", extra="ignore")

    url: SecretStr = Field(
        default_factory=default_database_url,
        description=(
            "SQLAlchemy URL of the metadata database, e.g. "
            "`postgresql+psycopg://user:pass@host:5432/epiflow` or `sqlite:////abs/path.db` "
            "(env EPIFLOW_DATABASE_URL; default `sqlite:///$EPIFLOW_HOME/epiflow.db`). "
            "A secret: it may hold a password."
        ),
    )
    echo: bool = Field(default=False, description="Log every SQL statement (debugging only).")
    connect_timeout_s: int = Field(
        default=5,
        gt=0,
        description=(
            "Seconds to wait for a PostgreSQL connection before failing "
            "(env EPIFLOW_DATABASE_CONNECT_TIMEOUT_S)."
        ),
    )
    statement_timeout_s: float = Field(
        default=600.0,
        ge=0,
        description=(
            "PostgreSQL `statement_timeout`: the server cancels a statement running longer "
            "(0: none). Migrations run without it (env EPIFLOW_DATABASE_STATEMENT_TIMEOUT_S)."
        ),
    )
    lock_timeout_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "PostgreSQL `lock_timeout`: a statement waiting longer for a lock fails "
            "(0: none) (env EPIFLOW_DATABASE_LOCK_TIMEOUT_S)."
        ),
    )
    keepalive_idle_s: int = Field(
        default=30,
        gt=0,
        description=(
            "TCP keepalives on PostgreSQL connections: the first probe after this many idle "
            "seconds, then every 10 s; 3 unanswered probes drop the connection, so a server "
            "host that vanished is noticed (env EPIFLOW_DATABASE_KEEPALIVE_IDLE_S)."
        ),
    )

    @field_validator("url")
    @classmethod
    def _parseable(cls, value: SecretStr) -> SecretStr:
        # Never echo the value: it may contain a password. The backend and driver names
        # are safe to show.
        try:
            url = make_url(value.get_secret_value())
        except (ArgumentError, ValueError) as e:
            raise ValueError(
                "EPIFLOW_DATABASE_URL is not a valid SQLAlchemy URL "
                "(expected e.g. postgresql+psycopg://user:pass@host/db or sqlite:///file.db)"
            ) from e
        if url.get_backend_name() not in SUPPORTED_BACKENDS:
            raise ValueError(
                f"EPIFLOW_DATABASE_URL names a {url.get_backend_name()!r} database; epiflow "
                "supports postgresql (postgresql+psycopg://user:pass@host/db) and sqlite "
                "(sqlite:///file.db)"
            )
        try:
            url.get_dialect()
        except ArgumentError as e:  # NoSuchModuleError: no such driver in SQLAlchemy
            raise ValueError(
                f"EPIFLOW_DATABASE_URL names an unknown driver {url.get_driver_name()!r} for "
                f"{url.get_backend_name()} (use postgresql+psycopg://… or sqlite:///…)"
            ) from e
        return value

    def redacted_url(self) -> str:
        """The URL with its password masked, for messages."""
        return make_url(self.url.get_secret_value()).render_as_string(hide_password=True)

    @property
    def is_sqlite(self) -> bool:
        return make_url(self.url.get_secret_value()).get_backend_name() == "sqlite"


class ObjectStoreSettings(BaseSettings):
    """Where objects live: a local directory by default, or any S3 bucket (MinIO in production)."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_OBJECTS_", extra="ignore")

    url: str = Field(
        default_factory=default_objects_url,
        description=(
            "A local directory path (or `file:///abs/path`), or `s3://bucket[/prefix]` "
            "(env EPIFLOW_OBJECTS_URL; default `$EPIFLOW_HOME/objects`)."
        ),
    )
    endpoint: str | None = Field(
        default=None,
        description="S3 endpoint as host:port, e.g. `minio:9000` (env EPIFLOW_OBJECTS_ENDPOINT).",
    )
    access_key: SecretStr | None = Field(
        default=None, description="S3 access key (env EPIFLOW_OBJECTS_ACCESS_KEY)."
    )
    secret_key: SecretStr | None = Field(
        default=None, description="S3 secret key (env EPIFLOW_OBJECTS_SECRET_KEY)."
    )
    anonymous: bool = Field(
        default=False,
        description=(
            "Send unsigned requests to a public bucket (env EPIFLOW_OBJECTS_ANONYMOUS). "
            "Without it, an s3:// store with no keys is refused with a message."
        ),
    )
    secure: bool = Field(
        default=True, description="Use HTTPS to reach the S3 endpoint (env EPIFLOW_OBJECTS_SECURE)."
    )
    region: str | None = Field(
        default=None, description="S3 region; MinIO ignores it (env EPIFLOW_OBJECTS_REGION)."
    )
    retries: int = Field(
        default=8,
        ge=0,
        description=(
            "Retries of an S3 call that failed transiently (dropped connection, timeout, "
            "5xx such as SlowDown/InternalError, an unparseable answer) before it fails, "
            "within `deadline_s` (env EPIFLOW_OBJECTS_RETRIES)."
        ),
    )
    backoff_s: float = Field(
        default=0.5,
        gt=0,
        description=(
            "Base retry delay in seconds: retry n waits a random time up to "
            "backoff_s·2^(n-1) (full jitter) (env EPIFLOW_OBJECTS_BACKOFF_S). The defaults "
            "back off for up to ~70 s in all, as S3 asks of a client it answers `SlowDown`."
        ),
    )
    backoff_max_s: float = Field(
        default=20.0,
        gt=0,
        description="Longest single retry delay in seconds (env EPIFLOW_OBJECTS_BACKOFF_MAX_S).",
    )
    connect_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds one request waits to connect (env EPIFLOW_OBJECTS_CONNECT_TIMEOUT_S).",
    )
    read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds one request waits for each part of its answer; an endpoint that "
            "accepts and never answers fails the attempt after this "
            "(env EPIFLOW_OBJECTS_READ_TIMEOUT_S)."
        ),
    )
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds one operation (an upload, a download, a listing) may spend, retries "
            "included: no retry starts past it, so an operation ends within "
            "deadline_s + read_timeout_s (env EPIFLOW_OBJECTS_DEADLINE_S)."
        ),
    )
    check_deadline_s: float = Field(
        default=15.0,
        gt=0,
        description=(
            "Deadline of the startup bucket check, retries included; each of its requests "
            "waits at most this long for an answer (env EPIFLOW_OBJECTS_CHECK_DEADLINE_S)."
        ),
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in ("", "file", "s3"):
            raise ValueError(
                f"EPIFLOW_OBJECTS_URL must be a directory, file:///path or s3://bucket, got scheme {scheme!r}"
            )
        if scheme == "s3" and not urlsplit(value).netloc:
            raise ValueError("EPIFLOW_OBJECTS_URL=s3://… needs a bucket name, e.g. s3://epiflow")
        return value

    @property
    def is_s3(self) -> bool:
        return urlsplit(self.url).scheme == "s3"

    def bucket_and_prefix(self) -> tuple[str, str]:
        """For s3:// URLs: the bucket and the key prefix (no leading/trailing slash)."""
        parts = urlsplit(self.url)
        return parts.netloc, parts.path.strip("/")

    def local_root(self) -> Path:
        """For local URLs: the directory."""
        parts = urlsplit(self.url)
        return Path(parts.path) if parts.scheme == "file" else Path(self.url)

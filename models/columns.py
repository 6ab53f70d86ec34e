"""Column helpers shared by every table: timezone-aware timestamps, JSON/JSONB, documented fields.

Every column carries its one-line docstring twice: as the pydantic `description` and as
the SQL column COMMENT, so `\\d+ episode` in psql shows data engineers what it means.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

# Named constraints make Alembic migrations (and SQLite batch mode) deterministic.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON on SQLite, JSONB on PostgreSQL.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores `timestamptz`; SQLite has no time zones, so values are stored as
    UTC and given `tzinfo=UTC` again when read. Naive datetimes are refused on write.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: epiflow stores timezone-aware UTC only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def doc(description: str, default: Any = ..., **kwargs: Any) -> Any:
    """A plain column with its docstring as description and SQL comment."""
    sa_kwargs = kwargs.pop("sa_column_kwargs", {})
    sa_kwargs.setdefault("comment", description)
    return Field(default, description=description, sa_column_kwargs=sa_kwargs, **kwargs)


def json_col(description: str, *, factory: Any = dict, nullable: bool = False) -> Any:
    """A JSON (JSONB on PostgreSQL) column."""
    if nullable:
        return Field(
            default=None,
            description=description,
            sa_column=Column(JSONType, nullable=True, comment=description),
        )
    return Field(
        default_factory=factory,
        description=description,
        sa_column=Column(JSONType, nullable=False, comment=description),
    )


def text_col(description: str, *, nullable: bool = False, default: Any = "") -> Any:
    """An unbounded text column."""
    return Field(
        default=None if nullable else default,
        description=description,
        sa_column=Column(Text, nullable=nullable, comment=description),
    )


def time_col(description: str, *, nullable: bool = False, index: bool = False) -> Any:
    """A timezone-aware UTC timestamp column; non-nullable ones default to now."""
    if not nullable:
        return Field(
            default_factory=utcnow,
            description=description,
            sa_column=Column(UTCDateTime(), nullable=False, index=index, comment=description),
        )
    return Field(
        default=None,
        description=description,
        sa_column=Column(UTCDateTime(), nullable=nullable, index=index, comment=description),
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


def fk(
    description: str,
    target: str,
    *,
    nullable: bool = True,
    index: bool = True,
    ondelete: str | None = None,
    primary_key: bool = False,
) -> Any:
    """A foreign-key column."""
    kwargs: dict[str, Any] = {}
    if ondelete:
        kwargs["ondelete"] = ondelete
    return Field(
        default=None if nullable else ...,
        foreign_key=target,
        primary_key=primary_key,
        index=index and not primary_key,
        nullable=nullable if not primary_key else False,
        description=description,
        sa_column_kwargs={"comment": description},
        **kwargs,
    )

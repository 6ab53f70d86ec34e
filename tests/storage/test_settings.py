"""Settings: defaults, validation messages naming the variable, secrets never shown."""

from __future__ import annotations

import pytest

from config.settings import ConfigError, load_settings
from storage.settings import DatabaseSettings, ObjectStoreSettings


def test_defaults_are_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPIFLOW_DATABASE_URL")
    monkeypatch.delenv("EPIFLOW_OBJECTS_URL")
    settings = load_settings()
    assert settings.database.redacted_url() == "sqlite:///.epiflow/epiflow.db"
    assert str(settings.objects.local_root()) == ".epiflow/objects"
    assert settings.prefect.api_url is None


def test_secrets_absent_from_repr_and_str(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_DATABASE_URL", "postgresql+psycopg://u:db-secret@h/db")
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", "s3://bucket/prefix")
    monkeypatch.setenv("EPIFLOW_OBJECTS_ENDPOINT", "minio:9000")
    monkeypatch.setenv("EPIFLOW_OBJECTS_ACCESS_KEY", "access-secret")
    monkeypatch.setenv("EPIFLOW_OBJECTS_SECRET_KEY", "secret-secret")
    settings = load_settings()
    shown = (
        repr(settings)
        + str(settings)
        + settings.database.redacted_url()
        + str(settings.objects.model_dump())
    )
    for secret in ("db-secret", "access-secret", "secret-secret"):
        assert secret not in shown
    assert settings.objects.bucket_and_prefix() == ("bucket", "prefix")


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("EPIFLOW_OBJECTS_URL", "ftp://host/x", "EPIFLOW_OBJECTS_URL"),
        ("EPIFLOW_OBJECTS_URL", "s3://", "bucket"),
        ("EPIFLOW_DATABASE_URL", "not a url at all", "EPIFLOW_DATABASE_URL"),
        ("EPIFLOW_OBJECTS_RETRIES", "-1", "EPIFLOW_OBJECTS_RETRIES"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as e:
        load_settings()
    assert expected in str(e.value)
    assert e.value.setting == variable


def test_every_field_is_described() -> None:
    for cls in (DatabaseSettings, ObjectStoreSettings):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"

"""Settings: defaults, validation messages naming the variable, secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import ConfigError, load_settings
from core.home import HomeInvalid
from storage.settings import DatabaseSettings, ObjectStoreSettings


def test_defaults_are_embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EPIFLOW_DATABASE_URL")
    monkeypatch.delenv("EPIFLOW_OBJECTS_URL")
    monkeypatch.setenv("EPIFLOW_HOME", str(tmp_path / "home"))
    settings = load_settings()
    assert settings.database.redacted_url() == f"sqlite:///{tmp_path}/home/epiflow.db"
    assert settings.objects.local_root() == tmp_path / "home" / "objects"
    assert settings.prefect.api_url is None


def test_home_defaults_to_an_absolute_user_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Whatever the working directory, the defaults are the same absolute paths.
    monkeypatch.delenv("EPIFLOW_DATABASE_URL")
    monkeypatch.delenv("EPIFLOW_OBJECTS_URL")
    monkeypatch.delenv("EPIFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    seen = set()
    for cwd in (tmp_path, tmp_path / "elsewhere"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        settings = load_settings()
        seen.add((settings.database.redacted_url(), str(settings.objects.local_root())))
    assert seen == {
        (f"sqlite:///{tmp_path}/user/.epiflow/epiflow.db", f"{tmp_path}/user/.epiflow/objects")
    }


def test_relative_home_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPIFLOW_DATABASE_URL")
    monkeypatch.setenv("EPIFLOW_HOME", "relative/home")
    with pytest.raises(HomeInvalid) as raised:
        load_settings()
    assert raised.value.setting == "EPIFLOW_HOME"
    assert "absolute" in raised.value.user_message()


def test_explicit_urls_do_not_need_a_valid_home(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests and deployments that set both URLs never read EPIFLOW_HOME.
    monkeypatch.setenv("EPIFLOW_HOME", "relative/home")
    settings = load_settings()
    assert settings.database.redacted_url().startswith("sqlite:///")


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
        ("EPIFLOW_DATABASE_URL", "postgresql+nodriver://u:p@h/db", "unknown driver 'nodriver'"),
        ("EPIFLOW_DATABASE_URL", "mysql://u:p@h/db", "supports postgresql"),
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

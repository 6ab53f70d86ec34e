"""Unknown `EPIFLOW_*` variables are refused naming the nearest real setting, and every
variable the docs mention is one a setting reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import ConfigError, check_environment, known_variables, load_settings

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
ROOT = Path(__file__).resolve().parents[2]


def test_a_typo_is_refused_naming_the_real_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_DATABSE_URL", "postgresql+psycopg://u:secret@h/db")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = raised.value.user_message()
    assert "EPIFLOW_DATABSE_URL (did you mean EPIFLOW_DATABASE_URL?)" in message
    assert raised.value.setting == "EPIFLOW_DATABSE_URL"
    assert "secret" not in message and "\n" not in message


def test_every_unknown_variable_is_listed_and_allowed_ones_pass() -> None:
    with pytest.raises(ConfigError) as raised:
        check_environment(
            {
                "EPIFLOW_OBJECTS_ENDPIONT": "x",
                "epiflow_sandbox_nsjail_pth": "y",  # settings are read case-insensitively
                "EPIFLOW_ZZZZZZ": "z",
                "EPIFLOW_TEST_ANYTHING": "ok",
                "EPIFLOW_HOME": "/h",
                "EPIFLOW_DATABASE_URL": "sqlite://",
                "PATH": "/bin",
            }
        )
    message = raised.value.user_message()
    assert "EPIFLOW_OBJECTS_ENDPIONT (did you mean EPIFLOW_OBJECTS_ENDPOINT?)" in message
    assert "epiflow_sandbox_nsjail_pth (did you mean EPIFLOW_SANDBOX_NSJAIL_PATH?)" in message
    assert "EPIFLOW_ZZZZZZ: no epiflow setting reads it" in message  # nothing near it
    assert "EPIFLOW_TEST_ANYTHING" not in message and "EPIFLOW_HOME" not in message
    check_environment(
        {
            "EPIFLOW_HOME": "/h",
            "EPIFLOW_TEST_X": "1",
            "EPIFLOW_QUALITY_TRAINING_TRIGGER_VOLUME": "5",
        }
    )


def test_every_variable_the_docs_name_is_known() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = set()
    for path in documents:
        # The docs show what a typo gets: `EPIFLOW_DATABSE_URL (did you mean …?)`.
        text = re.sub(r"EPIFLOW_\w+ \(did you mean", "", path.read_text())
        named.update(re.findall(r"EPIFLOW_[A-Z0-9_]*[A-Z0-9]", text))
    prefixes = {name for name in named if any(k.startswith(name + "_") for k in known_variables())}
    unknown = sorted(named - known_variables() - prefixes)
    assert [n for n in unknown if not n.startswith("EPIFLOW_TEST")] == []


def test_cli_refuses_a_typo_before_writing_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(EPIFLOW_HOME=str(tmp_path / "home"), EPIFLOW_DATABSE_URL="sqlite:////nowhere.db")
    done = subprocess.run(
        [EPIFLOW, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean EPIFLOW_DATABASE_URL?" in lines[0], done.stderr
    assert not (tmp_path / "home").exists()  # the default database was never created

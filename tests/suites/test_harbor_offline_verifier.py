"""Terminal-Bench-style verifiers offline: what `tests/test.sh` installs at verify time
(`apt-get install`, pinned `pip install`, `uvx -p` of the image's Python) is provisioned
ahead (`suites/harbor/toolkit.py`), and what cannot be (a Python the image lacks) is an
infrastructure error naming it.

The scanning is pure (fast); the end-to-end test builds the images (mmdebstrap + chroot:
root needed) and runs each verifier through the real episode loop in real nsjail jails,
which have no network.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox.images import ImagePlan, RunStep
from suites.harbor.toolkit import (
    verifier_apt_packages,
    verifier_provisioning,
    verifier_requirements,
    verifier_uses_pip,
    with_verifier_packages,
)
from tasks.harbor_verify import offline_reason
from tests.suites.test_harbor_tasks import IMAGES, _episode, _task, builds_images, needs_builder

TB_STYLE = """\
#!/bin/bash
set -e
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends jq curl
pip install pytest==8.4.1 iniconfig==2.1.0
echo '{"ok": 1}' | jq -e '.ok == 1'
pytest --version
python3 -c "import iniconfig, pytest; assert pytest.__version__ == '8.4.1'"
uvx -p 3.13 --with pytest==8.4.1 pytest --version
echo 1 > /logs/verifier/reward.txt
"""


def test_a_python_the_image_lacks_is_named_apart_from_the_network() -> None:
    marker = "uvx -p 3.12 pytest: error: No interpreter found for Python 3.12 in search path\n"
    assert offline_reason(marker).startswith("the verifier needs Python 3.12, which the image")
    assert offline_reason("curl https://example.com\n").startswith("the verifier needs the network")


def test_what_a_verifier_installs_is_read_from_its_script() -> None:
    assert verifier_apt_packages(TB_STYLE) == ("jq",)  # curl: the shim stands for it
    assert verifier_apt_packages("apt -y install vim=2:9.1 $EXTRA tmux") == ("tmux", "vim")
    assert verifier_uses_pip(TB_STYLE) and not verifier_uses_pip("uv pip install x==1")
    assert verifier_provisioning(TB_STYLE) == ("jq", "python3-pip")
    assert verifier_requirements(TB_STYLE) == ("iniconfig==2.1.0", "pytest==8.4.1")
    with_pip = ImagePlan(release="trixie", packages=("python3-pip",), context="/nonexistent")
    step = with_verifier_packages(with_pip, TB_STYLE).steps[-1]
    assert isinstance(step, RunStep) and step.command.count("python3-pip") == 0
    assert "install -y -qq jq " in step.command  # with recommends, as test.sh's apt-get
    assert with_verifier_packages(with_pip, "uvx pytest") is with_pip


@pytest.fixture(scope="module")
def offline_episodes():
    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    toml = 'version = "1.0"\n[verifier]\ntimeout_sec = 300\n[agent]\ntimeout_sec = 60\n'
    try:
        _task(
            root, "tb-style", toml=toml,
            dockerfile="FROM python:3.13-slim\nWORKDIR /app\n",
            test_sh=TB_STYLE, solve="#!/bin/bash\ntrue\n",
        )  # fmt: skip
        _task(
            root, "other-python", toml=toml,
            dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
            test_sh=(
                "#!/bin/bash\nuvx -p 3.12 --with pytest==8.4.1 pytest --version || exit 1\n"
                "echo 1 > /logs/verifier/reward.txt\n"
            ),
            solve="#!/bin/bash\ntrue\n",
        )  # fmt: skip
        IMAGES.mkdir(exist_ok=True)
        from suites.harbor.suite import load_harbor_suite

        suite = load_harbor_suite(root, name="offline", images_dir=IMAGES)
        yield {
            name: (suite.generate(name, 0), _episode(suite.generate(name, 0), "scripted:oracle"))
            for name in ("tb-style", "other-python")
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_builder
@builds_images
def test_apt_pip_and_uvx_of_the_images_python_work_offline(offline_episodes) -> None:
    from agent.trajectory import EpisodeStatus

    task, traj = offline_episodes["tb-style"]
    assert traj.status == EpisodeStatus.SUCCESS and traj.verifier_score == 1.0, (
        traj.failure_reason,
        traj.verifier_reason,
        traj.verifier_details.get("harbor", {}).get("test_sh_exit_code"),
    )
    assert task.environment is not None
    assert any("jq python3-pip" in s for s in task.environment.substitutions)


@needs_builder
@builds_images
def test_uvx_of_a_python_the_image_lacks_is_an_env_error_naming_it(offline_episodes) -> None:
    from agent.trajectory import EpisodeStatus

    _, traj = offline_episodes["other-python"]
    assert traj.status == EpisodeStatus.ENV_ERROR, (traj.status, traj.verifier_reason)
    assert "the verifier needs Python 3.12, which the image does not have" in (
        traj.failure_reason or ""
    ), traj.failure_reason


def _project(root: Path, name: str, *, c_extension: bool) -> Path:
    folder = root / name
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("VALUE = 1\n")
    ext = ""
    if c_extension:
        (folder / "fast.c").write_text(
            "#include <Python.h>\n"
            'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "fast", 0, -1, 0};\n'
            "PyMODINIT_FUNC PyInit_fast(void) { return PyModule_Create(&m); }\n"
        )
        ext = ", ext_modules=[Extension('fast', ['fast.c'])]"
    (folder / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        f"setup(name={name!r}, version='1.0', packages=[{name!r}]{ext})\n"
    )
    return folder


def test_a_source_only_requirement_is_built_on_the_host_only_when_pure(tmp_path: Path) -> None:
    """A pin PyPI serves only as an sdist (Terminal-Bench's regex-chess pins
    `chess==1.11.2`) is built into a wheel on the host and provisioned when the wheel is
    pure Python; an sdist with compiled code is not (its wheel would be the host's
    Python's), and the download error stays. Reaches PyPI (setuptools for the builds, the
    other pins), as the toolkit's builds do."""
    from suites.harbor.toolkit import _download_wheels, _pure_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    assert _pure_wheel(wheels, str(_project(tmp_path, "purepkg", c_extension=False)))
    assert [p.name for p in wheels.iterdir()] == ["purepkg-1.0-py3-none-any.whl"]
    if shutil.which("gcc"):
        assert not _pure_wheel(wheels, str(_project(tmp_path, "cpkg", c_extension=True)))
        assert [p.name for p in wheels.iterdir()] == ["purepkg-1.0-py3-none-any.whl"]
    chess = tmp_path / "chess-wheels"
    chess.mkdir()
    _download_wheels(chess, ("chess==1.11.2", "pytest==8.4.1"), "3.13")
    names = {p.name for p in chess.iterdir()}
    assert "chess-1.11.2-py3-none-any.whl" in names and "pytest-8.4.1-py3-none-any.whl" in names

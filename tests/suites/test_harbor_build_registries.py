"""A Harbor build's `RUN pip install …` reaches what the host's pip reaches: the host's
registry settings (`sandbox/host_registries.py`) are carried into every `RUN` step.

The fast test reads a pip configuration the test writes (its own `PIP_CONFIG_FILE` and
`PIP_*` variables) and checks what a step gets. The build test runs a real image build
(mmdebstrap + chroot: root needed) whose Dockerfile pins a package that exists only in a
find-links folder the test names in the host's settings, with the index switched off: the
build can install it only through the carried settings.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
import zipfile
from pathlib import Path

from sandbox.host_registries import HOST_DIR, host_registries, pip_config
from tests.suites.test_harbor_tasks import IMAGES, _task, builds_images, needs_builder

PROBE = "epiflow_build_probe"


def _wheel(folder: Path) -> Path:
    """A pure-Python wheel `epiflow-build-probe==1.0` (module `epiflow_build_probe`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PROBE}-1.0-py3-none-any.whl"
    info = f"{PROBE}-1.0.dist-info"
    files = {
        f"{PROBE}.py": "VALUE = 'from the host registry'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def test_pip_config_list_precedence_is_pips() -> None:
    listed = (
        "global.index-url='https://global.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        ":env:.find-links='/srv/wheels'\n"
        "global.find-links='/ignored'\n"
        "global.constraint='/etc/c.txt'\n"
    )
    assert pip_config(listed) == {
        "index-url": "https://install.example/simple",
        "find-links": "/srv/wheels",
    }


def test_a_step_gets_the_hosts_pip_settings_ca_and_proxy_with_paths_bound(
    tmp_path: Path,
) -> None:
    index = tmp_path / "mirror" / "simple"
    index.mkdir(parents=True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nindex-url = file://{index}\ntrusted-host = mirror.example\n"
        f"cert = {ca}\nconstraint = /etc/not-carried.txt\n"
    )
    environ = {
        "PATH": "/usr/bin:/bin",
        "PIP_CONFIG_FILE": str(conf),
        "PIP_FIND_LINKS": f"{wheels} https://wheels.example/ /no/such/folder",
        "https_proxy": "http://proxy.example:3128",
        "NO_PROXY": "localhost",
        "SSL_CERT_FILE": str(ca),
    }
    carried = host_registries(environ, apt_options=('Acquire::http::Proxy "http://p:3142"',))
    assert carried.env["PIP_INDEX_URL"] == f"file://{HOST_DIR}{index}"
    assert carried.env["PIP_FIND_LINKS"] == f"{HOST_DIR}{wheels} https://wheels.example/"
    assert carried.env["PIP_TRUSTED_HOST"] == "mirror.example"
    assert carried.env["PIP_CERT"] == carried.env["SSL_CERT_FILE"] == f"{HOST_DIR}{ca}"
    assert "PIP_CONSTRAINT" not in carried.env
    assert (carried.env["https_proxy"], carried.env["NO_PROXY"]) == (
        "http://proxy.example:3128",
        "localhost",
    )
    # the index's folder above `simple/` is bound (its pages link `../../files/…`)
    assert dict(carried.binds) == {
        str(index.parent): f"{HOST_DIR}{index.parent}",
        str(wheels): f"{HOST_DIR}{wheels}",
        str(ca): f"{HOST_DIR}{ca}",
    }
    assert carried.env["APT_CONFIG"] == f"{HOST_DIR}/apt.conf"
    assert carried.apt_conf.splitlines() == [
        'Acquire::http::Proxy "http://p:3142";',
        f'Acquire::https::CaInfo "{HOST_DIR}{ca}";',
    ]


def test_without_a_pip_to_ask_the_pip_variables_are_carried(tmp_path: Path) -> None:
    environ = {"PIP_INDEX_URL": "https://mirror.example/simple", "PIP_TRUSTED_HOST": "mirror"}
    carried = host_registries(environ, python=str(tmp_path / "no-python"), apt_options=())
    assert carried.env == {
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_TRUSTED_HOST": "mirror",
    }
    assert carried.binds == () and carried.apt_conf == ""


@needs_builder
@builds_images
def test_run_pip_install_in_a_build_uses_the_hosts_find_links(monkeypatch) -> None:
    from suites.harbor.suite import load_harbor_suite

    root = Path(tempfile.mkdtemp(dir=IMAGES.parent))
    root.chmod(0o755)
    try:
        wheels = root / "wheelhouse"
        _wheel(wheels)
        for path in (wheels, *wheels.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        _task(
            root, "pip-build",
            toml='version = "1.0"\n',
            dockerfile=(
                "FROM python:3.13-slim\nWORKDIR /app\n"
                "RUN pip install epiflow-build-probe==1.0 && "
                f"python3 -c 'import {PROBE}; print({PROBE}.VALUE)' > /app/probe.txt\n"
            ),
            test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        )  # fmt: skip
        IMAGES.mkdir(exist_ok=True)
        suite = load_harbor_suite(root, name="builds", images_dir=IMAGES)
        env = suite.environment("pip-build")
        image = Path(env.image.root)
        assert (image / "app" / "probe.txt").read_text() == "from the host registry\n"
        assert not (image / HOST_DIR.lstrip("/")).exists()  # nothing of the host stays
    finally:
        shutil.rmtree(root, ignore_errors=True)

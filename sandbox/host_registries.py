"""The host's package-registry settings, carried into an image build's `RUN` steps.

A `RUN pip install …` or `RUN apt-get install …` in a Harbor task's Dockerfile runs in a
chroot of the image (`sandbox/images.py`), which has none of the host's configuration: no
pip index, find-links or certificate bundle, no proxy. On a host that reaches its package
registries only through such settings (a local simple index, a TLS-intercepting egress
proxy whose CA is in the host's bundle), the build could not fetch what the host fetches.
`host_registries()` reads them once per build:

- pip: `index-url`, `extra-index-url`, `find-links`, `no-index`, `trusted-host`, `cert`, `client-cert`,
  `proxy`, `timeout`/`default-timeout`, `retries` from `python -m pip config list` (every
  config file and `PIP_*` variable, the later scope winning as in pip: `global`, then
  `install`, then the environment) → `PIP_*` variables of the step;
- TLS: the CA files the host names in `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`
  (and pip's `cert`) → the same variables, so curl, uv and Python's ssl trust what the host
  trusts;
- proxies: `http_proxy`, `https_proxy`, `no_proxy`, `all_proxy`, `ftp_proxy` (either case);
- apt: `Acquire::*::Proxy` from the host's `apt-config dump` and the CA file for https
  sources, in an apt.conf named by `APT_CONFIG` (read before the image's own apt.conf.d).

Local paths (a `file://` index, a find-links folder, a certificate) are bound read-only
under `/.epiflow-host/` (`HOST_DIR`, a tmpfs that exists only while the step runs) and the
values rewritten to point there; nothing is written into the image. These settings change
how packages are fetched, not which step runs, so they are not part of an image's digest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict, Field

HOST_DIR = "/.epiflow-host"
"""Where the host's files appear inside a build step (a tmpfs, gone after the step)."""
PIP_KEYS = (
    "index-url", "extra-index-url", "find-links", "no-index", "trusted-host", "cert",
    "client-cert", "proxy", "timeout", "default-timeout", "retries",
)  # fmt: skip
"""The pip settings that decide where and how packages are fetched (what is carried)."""
_PATH_KEYS = {"find-links", "index-url", "extra-index-url", "cert", "client-cert"}
_CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "ftp_proxy")
_SCOPES = ("global", "download", "install", ":env:")
"""pip's precedence, lowest first (pip reads `global`, then the command's section, then env)."""


class HostRegistries(BaseModel):
    """What a build step gets of the host's registry settings."""

    model_config = ConfigDict(frozen=True)

    env: dict[str, str] = Field(default_factory=dict)
    """Variables of every `RUN` step (`PIP_*`, CA bundles, proxies, `APT_CONFIG`)."""
    binds: tuple[tuple[str, str], ...] = ()
    """(host path, path inside the step) pairs bound read-only under `HOST_DIR`."""
    apt_conf: str = ""
    """apt configuration (`APT_CONFIG`) for the step; empty when there is nothing to carry."""
    apt_options: tuple[str, ...] = ()
    """The host's apt proxies as `mmdebstrap --aptopt` values (for building a base)."""


def pip_config(lines: str) -> dict[str, str]:
    """The effective pip settings of `pip config list` output (`scope.key='value'` lines)."""
    found: dict[tuple[str, str], str] = {}
    for line in lines.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        scope, _, key = name.rpartition(".")
        found[(scope, key)] = value.strip().strip("'\"")
    out: dict[str, str] = {}
    for scope in _SCOPES:
        for (where, key), value in found.items():
            if where == scope and key in PIP_KEYS:
                out[key] = value
    return out


def _read_pip_config(python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """pip's effective settings; without a pip to ask (a uv-made venv), the `PIP_*` variables."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True, text=True, timeout=60, check=False, env=dict(environ),
        )  # fmt: skip
        if done.returncode == 0:
            return pip_config(done.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    variables = {f"PIP_{key.upper().replace('-', '_')}": key for key in PIP_KEYS}
    return {key: environ[name] for name, key in variables.items() if environ.get(name)}


def host_apt_proxies() -> tuple[str, ...]:
    """The host's `Acquire::*::Proxy` apt settings (`apt-config dump`), as `NAME "value"`."""
    if shutil.which("apt-config") is None:
        return ()
    try:
        done = subprocess.run(
            ["apt-config", "dump"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    options = []
    for line in done.stdout.splitlines():
        name, _, value = line.strip().partition(" ")
        value = value.strip().rstrip(";")
        if name.startswith("Acquire::") and name.endswith("::Proxy") and value.strip('"'):
            options.append(f"{name} {value}")
    return tuple(options)


class _Binder:
    """Host paths → their place under `HOST_DIR`, each bound once."""

    def __init__(self) -> None:
        self.binds: dict[str, str] = {}

    def path(self, host: str, *, bind_parent: bool = False) -> str | None:
        real = Path(host).resolve()
        if not real.exists():
            return None
        bound = real.parent if bind_parent and real.parent != real else real
        self.binds[str(bound)] = f"{HOST_DIR}{bound}"
        return f"{HOST_DIR}{real}"

    def value(self, key: str, value: str) -> str:
        """A pip setting's value with its local paths rewritten (missing ones dropped)."""
        if key not in _PATH_KEYS:
            return value
        out = []
        for word in value.split():
            parsed = urlparse(word)
            if parsed.scheme == "file":
                # A simple index links its files relatively (`../../files/x.whl`): bind
                # the folder above it too.
                inside = self.path(unquote(parsed.path), bind_parent=key != "find-links")
                if inside is not None:
                    out.append(f"file://{inside}")
            elif parsed.scheme:
                out.append(word)
            else:
                inside = self.path(word)
                if inside is not None:
                    out.append(inside)
        return " ".join(out)

    def nested(self) -> tuple[tuple[str, str], ...]:
        """The binds, none inside another (a folder bound covers what lies under it)."""
        paths = sorted(self.binds)
        kept = [p for p in paths if not any(p.startswith(q + "/") for q in paths if q != p)]
        return tuple((p, self.binds[p]) for p in kept)


def host_registries(
    environ: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
    apt_options: tuple[str, ...] | None = None,
) -> HostRegistries:
    """The host's registry settings (pip's through `python -m pip config list`, which also
    reads the `PIP_*` variables of `environ`, and apt's through `apt-config dump`)."""
    environ = os.environ if environ is None else environ
    binder = _Binder()
    env: dict[str, str] = {}
    pip = _read_pip_config(python or sys.executable, environ)
    for key, value in pip.items():
        carried = binder.value(key, value)
        if carried:
            env[f"PIP_{key.upper().replace('-', '_')}"] = carried
    ca_file = ""
    for name in (*_CA_VARS, "PIP_CERT"):
        host = environ.get(name) if name != "PIP_CERT" else pip.get("cert")
        if host and Path(host).is_file():
            inside = binder.path(host)
            if inside is not None:
                ca_file = ca_file or inside
                if name != "PIP_CERT":
                    env[name] = inside
    for name in _PROXY_VARS:
        for variant in (name, name.upper()):
            if environ.get(variant):
                env[variant] = environ[variant]
    options = host_apt_proxies() if apt_options is None else apt_options
    lines = [f"{option};" for option in options]
    if ca_file:
        lines.append(f'Acquire::https::CaInfo "{ca_file}";')
    apt_conf = "\n".join(lines) + "\n" if lines else ""
    if apt_conf:
        env["APT_CONFIG"] = f"{HOST_DIR}/apt.conf"
    return HostRegistries(env=env, binds=binder.nested(), apt_conf=apt_conf, apt_options=options)

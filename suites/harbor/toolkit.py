"""The offline verifier toolkit: what Harbor verifiers fetch at verify time, provisioned ahead.

Most Terminal-Bench-style `tests/test.sh` scripts bootstrap their test toolchain from the
internet: `apt-get update && apt-get install -y curl`, the uv installer through
`curl -LsSf https://astral.sh/uv/<version>/install.sh | sh`, `source $HOME/.local/bin/env`,
then `uvx [-p 3.13] --with|-w pytest==8.4.1 --with|-w pytest-json-ctrf==0.3.5 pytest …`.
A verifier jail has no network, so the toolkit (bound read-only at `/opt/epiflow`, its
`shims/` first on `PATH`, in the verifier jail only) makes the same script work offline:

- `bin/uv`, `bin/uvx`: the host's uv (a static binary), whatever version the script asked for;
- `wheels/`: every requirement the script pins with `--with`/`-w` (uvx, `uv run`) or
  `pip install`/`uv pip install`, plus their dependencies, downloaded from PyPI once for
  the image's Python; uv and pip are pointed at it offline (`UV_OFFLINE`, `UV_FIND_LINKS`,
  `PIP_NO_INDEX`, `PIP_FIND_LINKS`) and never download a Python;
- the image: the Debian packages `test.sh` installs (`apt-get install -y jq`), and
  `python3-pip` when it runs pip, installed by a last build step
  (`with_verifier_packages`);
- `shims/`: `apt-get`/`apt` (`update` succeeds; `install` succeeds for packages already in
  the image and for `curl`/`wget`/`ca-certificates`, which the shims stand for), `curl`/`wget`
  (the uv installer URL serves `uv-install.sh`, which links uv into `$HOME/.local/bin`
  and writes `$HOME/.local/bin/env`), and `uv`/`uvx`/`pip`/`pip3` wrappers.

Anything else that would need the network (another URL, a package not in the image, a
requirement not provisioned, `uvx -p` of a Python the image lacks), and requirements too big
for the verifier jail's RAM-backed `/tmp` (uv's cache and environments: `torch` with its CUDA
libraries), fail in the script and are written to `/logs/.epiflow-offline`; the verifier then
reports an infrastructure error naming it (`env_error`), never a reward of 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from sandbox.images import ImageBuildError, ImagePlan, RunStep, _locked

TOOLKIT_VERSION = "3"

_WITH = re.compile(
    r"(?:^|\s)(?:--with|-w)[\s=]+['\"]?([A-Za-z0-9_.\-\[\],]+(?:[=<>!~]=?[^\s'\"]+)?)"
)
_PIP = re.compile(r"\b(?:pip3?|uv pip|python3? -m pip)\s+install\s+([^\n;&|]+)")


_APT = r"""#!/bin/sh
# epiflow offline shim: apt-get/apt without the network (docs/harbor.md)
cmd=""; pkgs=""
for a in "$@"; do
  case "$a" in -*) ;; *) if [ -z "$cmd" ]; then cmd="$a"; else pkgs="$pkgs $a"; fi ;; esac
done
case "$cmd" in
  update|clean|autoclean|autoremove) exit 0 ;;
  install)
    missing=""
    for p in $pkgs; do
      p="${p%%=*}"
      case "$p" in curl|wget|ca-certificates|gnupg|git-man) continue ;; esac
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && exit 0
    echo "apt-get install$missing (not in the image)" >> /logs/.epiflow-offline
    echo "epiflow: offline verifier: package(s)$missing not in the image; installing them needs the network" >&2
    exit 100 ;;
  *) echo "apt-get $cmd" >> /logs/.epiflow-offline
     echo "epiflow: offline verifier: apt-get $cmd needs the network" >&2
     exit 100 ;;
esac
"""

_FETCH = r"""#!/bin/sh
# epiflow offline shim: curl/wget serve the uv installer and nothing else (docs/harbor.md)
url=""; out=""; prev=""
for a in "$@"; do
  case "$prev" in -o|--output|-O|--output-document) out="$a" ;; esac
  case "$a" in http://*|https://*) url="$a" ;; --output=*|--output-document=*) out="${a#*=}" ;; esac
  prev="$a"
done
case "$url" in
  https://astral.sh/uv/install.sh|https://astral.sh/uv/*/install.sh|https://astral.sh/uv/install.sh?*)
    if [ -n "$out" ] && [ "$out" != "-" ]; then cp /opt/epiflow/uv-install.sh "$out"; else cat /opt/epiflow/uv-install.sh; fi
    exit 0 ;;
esac
echo "$(basename "$0") $url" >> /logs/.epiflow-offline
echo "epiflow: offline verifier: $(basename "$0") $url needs the network" >&2
exit 6
"""

_UV_INSTALL = r"""#!/bin/sh
# epiflow's stand-in for https://astral.sh/uv/install.sh: links the provisioned uv (docs/harbor.md)
set -e
dest="${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}"
mkdir -p "$dest"
ln -sf /opt/epiflow/shims/uv "$dest/uv"
ln -sf /opt/epiflow/shims/uvx "$dest/uvx"
printf '#!/bin/sh\ncase ":${PATH}:" in *:"%s":*) ;; *) export PATH="%s:$PATH" ;; esac\n' "$dest" "$dest" > "$dest/env"
echo "everything's installed! (epiflow offline uv)"
"""

_WRAP = r"""#!/bin/bash
# epiflow offline shim: runs the provisioned {tool}; a failure that needed the network is recorded
err="$(mktemp /logs/.epiflow-err.XXXXXX)"  # not /tmp: it may be what filled up
exec 3>&1
{real} "$@" 2>&1 1>&3 | tee "$err" 1>&2
rc=${{PIPESTATUS[0]}}
exec 3>&-
if [ "$rc" -ne 0 ] && grep -qiE "{patterns}" "$err"; then
  echo "{tool} $*: $(grep -iE "{patterns}" "$err" | head -1)" >> /logs/.epiflow-offline
fi
rm -f "$err"
exit "$rc"
"""
_UV_PATTERNS = (
    "offline|provided package locations|not found in the package registry|failed to fetch|"
    "dns error|no interpreter found|network|--no-index|no space left on device"
)
_PIP_PATTERNS = (
    "no matching distribution|could not find a version|no module named pip|network|"
    "no space left on device"
)


def verifier_requirements(test_sh: str) -> tuple[str, ...]:
    """The requirements a `test.sh` installs with uvx/uv `--with`/`-w` or pip (sorted, unique)."""
    found: set[str] = set()
    for match in _WITH.finditer(test_sh):
        found.add(match.group(1).strip("'\""))
    for match in _PIP.finditer(test_sh):
        for word in match.group(1).split():
            if word.startswith("-") or word.startswith("$"):
                continue
            found.add(word.strip("'\""))
    return tuple(sorted(r for r in found if re.match(r"^[A-Za-z0-9]", r)))


_APT_CALL = re.compile(r"\bapt(?:-get)?\b([^\n;&|]*)")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.\-]+(?::[a-z0-9]+)?$")
SHIMMED_PACKAGES = frozenset({"curl", "wget", "ca-certificates", "gnupg", "git-man"})
"""Packages the shims stand for (never installed for the verifier)."""


def verifier_apt_packages(test_sh: str) -> tuple[str, ...]:
    """The Debian packages a `test.sh` installs with `apt-get`/`apt install` (sorted, unique;
    versions dropped, the shimmed ones and `$variables` left out)."""
    found: set[str] = set()
    for match in _APT_CALL.finditer(test_sh):
        words = [w.strip("'\"") for w in match.group(1).split() if not w.startswith("-")]
        if not words or words[0] != "install":
            continue
        for word in words[1:]:
            name = word.split("=", 1)[0]
            if _PACKAGE.match(name) and name not in SHIMMED_PACKAGES:
                found.add(name)
    return tuple(sorted(found))


def verifier_uses_pip(test_sh: str) -> bool:
    """Whether `test.sh` runs pip itself (`pip install`, not `uv pip install`)."""
    return any(not m.group(0).startswith("uv") for m in _PIP.finditer(test_sh))


def verifier_provisioning(test_sh: str) -> tuple[str, ...]:
    """The Debian packages to install into the image ahead for `test.sh`: the ones it
    `apt-get install`s, and `python3-pip` when it runs pip (the pip shim needs it)."""
    packages = set(verifier_apt_packages(test_sh))
    if verifier_uses_pip(test_sh):
        packages.add("python3-pip")
    return tuple(sorted(packages))


def with_verifier_packages(plan: ImagePlan, test_sh: str) -> ImagePlan:
    """`plan` with the verifier's Debian packages (`verifier_provisioning`) installed by a
    last `RUN` step (recorded as a substitution: the agent's image has them too), with their
    recommends as `test.sh`'s own `apt-get install -y gcc` would (`libc6-dev`); `plan`
    itself when there are none beyond the base's own."""
    packages = [p for p in verifier_provisioning(test_sh) if p not in plan.packages]
    if not packages:
        return plan
    names = " ".join(packages)
    step = RunStep(
        line=0,
        command=(
            f"apt-get update -qq && apt-get install -y -qq {names} && rm -rf /var/lib/apt/lists/*"
        ),
        workdir="/",
    )
    note = f"tests/test.sh's packages installed ahead for the offline verifier: {names}"
    return plan.model_copy(
        update={"steps": (*plan.steps, step), "substitutions": (*plan.substitutions, note)}
    )


def _uv_binaries() -> tuple[Path, Path] | None:
    try:
        from uv import find_uv_bin

        uv = Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            return None
        uv = Path(found)
    uvx = uv.with_name("uvx")
    return (uv, uvx) if uvx.is_file() else None


def ensure_toolkit(images_dir: Path, requirements: tuple[str, ...], python: str) -> Path:
    """The toolkit folder for `requirements` on the image's `python` ("3.13"), built once.

    Raises:
        ImageBuildError: the wheels could not be downloaded, or uv is not installed on the host.
    """
    uv = _uv_binaries()
    if uv is None:
        raise ImageBuildError("the offline verifier toolkit needs uv on the host (pip install uv)")
    key = hashlib.sha256(
        json.dumps(
            [TOOLKIT_VERSION, list(requirements), python, str(uv[0].stat().st_size)]
        ).encode()
    ).hexdigest()[:16]
    folder = images_dir / f"toolkit-{key}"
    if (folder / "toolkit.json").is_file():
        return folder
    images_dir.mkdir(parents=True, exist_ok=True)
    with _locked(images_dir / f".lock-toolkit-{key}"):
        if (folder / "toolkit.json").is_file():
            return folder
        staging = images_dir / f".staging-{uuid.uuid4().hex[:12]}"
        try:
            _build(staging, requirements, python, uv)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


def _download(
    wheels: Path, requirements: tuple[str, ...], python: str, *, deps: bool = True
) -> subprocess.CompletedProcess[str]:
    """pip's download of `requirements` as wheels for CPython `python` on x86-64 Linux
    (wheels already in `wheels` count: `--find-links`)."""
    tag = python.replace(".", "")
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
        "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none",
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux_2_17_x86_64", "--platform", "any",
        "--find-links", str(wheels), *([] if deps else ["--no-deps"]),
        "-d", str(wheels), *requirements,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def _download_wheels(wheels: Path, requirements: tuple[str, ...], python: str) -> None:
    """Every requirement and its dependencies as wheels in `wheels`, for Python `python`.

    A requirement PyPI serves only as a source distribution (`chess==1.11.2`) has no wheel
    to download for another Python: it is built into a wheel on the host (`pip wheel
    --no-deps`), kept only when the wheel is pure Python (`py3-none-any`, which any Python
    3 installs), and the download is tried again with it found locally. A source
    distribution with compiled code cannot be built for the image's Python here: that
    stays the error below.

    Raises:
        ImageBuildError: a requirement or a dependency could not be provisioned.
    """
    done = _download(wheels, requirements, python)
    if done.returncode != 0:
        missing = [
            r for r in requirements if _download(wheels, (r,), python, deps=False).returncode
        ]
        built = [_pure_wheel(wheels, r) for r in missing]
        if built and all(built):
            done = _download(wheels, requirements, python)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(
            f"cannot provision the verifier's requirements {' '.join(requirements)} "
            f"for Python {python} from PyPI: {tail[:300]}"
        )


def _pure_wheel(wheels: Path, requirement: str) -> bool:
    """Build `requirement`'s source distribution into a wheel on the host and keep it in
    `wheels` when it is pure Python; whether it was kept."""
    scratch = wheels.parent / f".sdist-{uuid.uuid4().hex[:8]}"
    try:
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--no-binary=:all:", "-w", str(scratch), requirement],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        made = sorted(scratch.glob("*.whl")) if built.returncode == 0 else []
        if len(made) != 1 or not re.search(
            r"-py3(?:\.py\d+)*-none-any\.whl$|-py2\.py3-none-any\.whl$", made[0].name
        ):
            return False
        shutil.move(str(made[0]), wheels / made[0].name)
        return True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build(
    staging: Path, requirements: tuple[str, ...], python: str, uv: tuple[Path, Path]
) -> None:
    for sub in ("bin", "shims", "wheels"):
        (staging / sub).mkdir(parents=True)
    shutil.copy2(uv[0], staging / "bin" / "uv")
    shutil.copy2(uv[1], staging / "bin" / "uvx")
    if requirements:
        _download_wheels(staging / "wheels", requirements, python)
    scripts = {
        "shims/apt-get": _APT, "shims/apt": _APT, "shims/curl": _FETCH, "shims/wget": _FETCH,
        "uv-install.sh": _UV_INSTALL,
        "shims/uv": _WRAP.format(tool="uv", real="/opt/epiflow/bin/uv", patterns=_UV_PATTERNS),
        "shims/uvx": _WRAP.format(tool="uvx", real="/opt/epiflow/bin/uvx", patterns=_UV_PATTERNS),
        "shims/pip": _WRAP.format(tool="pip", real="python3 -m pip", patterns=_PIP_PATTERNS),
        "shims/pip3": _WRAP.format(tool="pip3", real="python3 -m pip", patterns=_PIP_PATTERNS),
    }  # fmt: skip
    for rel, text in scripts.items():
        (staging / rel).write_text(text)
        (staging / rel).chmod(0o755)
    (staging / "toolkit.json").write_text(
        json.dumps({"requirements": list(requirements), "python": python}, indent=2)
    )
    for folder, dirs, files in os.walk(staging):
        for name in dirs:
            (Path(folder) / name).chmod(0o755)
        for name in files:
            path = Path(folder) / name
            path.chmod(path.stat().st_mode | 0o444)
    staging.chmod(0o755)

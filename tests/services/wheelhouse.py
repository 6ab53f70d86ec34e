"""Wheels rebuilt from the distributions installed in the running venv, so a test can
install into a fresh venv with no index and no cache (offline, in seconds).

Each installed distribution's RECORD lists its files under site-packages; they are zipped
back (stored, uncompressed: speed over size) with a fresh RECORD. Files installed outside
site-packages (console scripts, data) are left out: installers regenerate the scripts from
`entry_points.txt`. The wheel keeps the original tag, name and version, so an installer
checks and picks it as it would the one from the index.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Iterable
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

_INSTALL_TIME = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def requirement_closure(root: str, extras: Iterable[str]) -> dict[str, Distribution]:
    """Installed distributions that `root[extras]` needs, by canonical name (root excluded)."""
    found: dict[str, Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(canonicalize_name(root), e) for e in ("", *extras)]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            dist = distribution(name)
        except PackageNotFoundError as e:
            raise LookupError(f"{name} is required but not installed in this venv") from e
        if name != canonicalize_name(root):
            found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.marker is None and extra:
                continue  # unconditional requirements were taken with extra ""
            child = canonicalize_name(req.name)
            todo += [(child, e) for e in ("", *sorted(req.extras))]
    return found


def repack(dist: Distribution, dest: Path) -> Path:
    """A wheel of an installed distribution, written into `dest`."""
    base = Path(str(dist.locate_file("")))
    files = [f for f in dist.files or [] if f.parts[0] != ".." and "__pycache__" not in f.parts]
    info_dir = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_meta = (base / info_dir / "WHEEL").read_text()
    tags = [
        line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")
    ]
    # The filename carries the compressed tag set (py2.py3-none-any): each part joined.
    parts = zip(*(t.split("-") for t in tags), strict=True)
    tag = "-".join(".".join(dict.fromkeys(p)) for p in parts)
    name = re.sub(r"[^\w\d.]+", "_", dist.metadata["Name"])
    target = dest / f"{name}-{dist.version}-{tag}.whl"
    record: list[str] = []
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as wheel:
        for f in files:
            arcname = f.as_posix()
            if f.parts[0] == info_dir and f.name in _INSTALL_TIME:
                continue
            path = base / f
            if not path.is_file():
                continue
            wheel.write(path, arcname)  # keeps the mode: executables stay executable
            data = path.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        wheel.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return target

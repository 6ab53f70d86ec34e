"""A `FROM` image → the Debian release its image is built from here (one substitution line).

`ubuntu:24.04`/`noble`/`latest` (dated tags too) and `python:3.12`+ → trixie (Python 3.13);
`ubuntu:22.04`/`20.04`, `python:3.11` → bookworm (Python 3.11), whatever codename the
tag names (`python:3.13-slim-bookworm` → trixie: the version the verifier asks for wins);
`python:` tags without a version, or an older one, by codename (`-bookworm` / `-trixie`); `debian:` by codename or version number (`bookworm`, `12`,
`12.5-slim`, `trixie`, `13.0-slim`, `stable`) → itself. A digest pin is dropped and
recorded. Anything else is refused, category `base-image`: alpine (musl), Debian 11 and
older, CUDA and other unknown images.

A mapping that builds another distribution, Debian codename or Python version than the tag
names is a **substituted base** (`BaseMapping.substituted`, one line, e.g.
"python:3.13-slim-bookworm built as Debian trixie (Python 3.13)"): `ubuntu:*` always
(another distribution), `python:3.13-slim-bookworm` (trixie, not bookworm),
`python:3.12` (Python 3.13, not 3.12), `python:3.10-slim-bookworm` (3.11, not 3.10). A tag
that names no codename (`python:3.11-slim`) or no minor version (`python:3`,
`python:latest`) names nothing that could differ; `debian:stable` is trixie today. Decided
here only; the task's environment carries it (`TaskEnvironment.base_substitution`) and the
episode loop reads it to keep a reference solution's failure on such a base out of the
agent's record (`agent/substituted_base.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from sandbox.images import Release
from suites.harbor.errors import RefusalCategory, UnsupportedEnvironment

_UBUNTU: dict[str, Release] = {
    "24.04": "trixie", "noble": "trixie", "latest": "trixie", "24.10": "trixie", "25.04": "trixie",
    "rolling": "trixie", "22.04": "bookworm", "jammy": "bookworm", "20.04": "bookworm",
    "focal": "bookworm",
}  # fmt: skip
_DEBIAN: dict[str, Release] = {
    "bookworm": "bookworm", "12": "bookworm", "trixie": "trixie", "13": "trixie",
    "stable": "trixie", "latest": "trixie",
}  # fmt: skip
_DEBIAN_OLD = {"bullseye": "11", "buster": "10", "stretch": "9", "11": "11", "10": "10", "9": "9"}
_PYTHON_OF: dict[Release, str] = {"bookworm": "3.11", "trixie": "3.13"}
_CODENAMES = ("stretch", "buster", "bullseye", "bookworm", "trixie", "forky")


class BaseMapping(NamedTuple):
    """How a `FROM` image is built here."""

    release: Release
    """The Debian release the image is built from."""
    python_base: bool
    """A `python:*` base (python links and CPython's headers added)."""
    note: str
    """The substitution line recorded with every build (`ImagePlan.substitutions`)."""
    substituted: str | None
    """The base built as another distribution, codename or Python version than its tag
    names, one line ("ubuntu:24.04 built as Debian trixie"); None: built as named."""


def map_base(image: str, file: Path, line: int) -> BaseMapping:
    """How the `FROM` image `image` is built here (its release, and whether it is substituted).

    Raises:
        UnsupportedEnvironment: (category `base-image`) the base cannot be built here.
    """
    name = image.removeprefix("docker.io/").removeprefix("library/")
    name, _, pin = name.partition("@")
    repo, _, tag = name.partition(":")
    tag = tag or "latest"
    pinned = f" (digest {pin[:19]}… not checked)" if pin else ""

    def refuse(message: str) -> UnsupportedEnvironment:
        return UnsupportedEnvironment(
            file, line, f"FROM {image}", message, category=RefusalCategory.BASE_IMAGE
        )

    if "alpine" in repo or "alpine" in tag:
        raise refuse("alpine (musl) bases are not supported; use a Debian, Ubuntu or python:* base")
    if repo == "ubuntu":
        mapped = _UBUNTU.get(tag) or _UBUNTU.get(tag.split("-")[0])
        if mapped is None:
            raise refuse(f"unknown ubuntu tag {tag!r} (supported: {', '.join(sorted(_UBUNTU))})")
        note = f"{image} → Debian {mapped} (minbase){pinned}"
        return BaseMapping(mapped, False, note, f"{image} built as Debian {mapped}")
    if repo == "debian":
        release = tag.split("-")[0]
        number = re.match(r"^(\d+)(?:\.\d+)*$", release)
        key = number.group(1) if number else release
        mapped = _DEBIAN.get(key)
        if mapped is None:
            old = _DEBIAN_OLD.get(key)
            raise refuse(
                (f"Debian {old} is not served here" if old else f"unknown debian tag {tag!r}")
                + " (served: bookworm = 12, trixie = 13, with -slim and point releases)"
            )
        return BaseMapping(mapped, False, f"{image} → Debian {mapped} (minbase){pinned}", None)
    if repo == "python":
        return _map_python(image, tag, pinned, refuse)
    raise refuse("unknown base image (supported: ubuntu:*, debian:bookworm|trixie, python:3.11+)")


def _map_python(
    image: str, tag: str, pinned: str, refuse: Callable[[str], UnsupportedEnvironment]
) -> BaseMapping:
    match = re.match(r"^(\d+)(?:\.(\d+))?", tag)
    minor = (
        int(match.group(2)) if match and match.group(2)
        else (13 if tag in ("latest", "3", "slim") else -1)
    )  # fmt: skip
    # The Python version decides over the tag's codename: a verifier that runs `uvx -p 3.13`
    # on `python:3.13-slim-bookworm` needs Python 3.13, which only trixie has here (Debian's
    # bookworm has 3.11); the userland's release then differs from the tag's, and says so.
    release: Release
    if match and match.group(1) == "3" and minor >= 12:
        release = "trixie"
    elif (match and match.group(1) == "3" and minor == 11) or "bookworm" in tag:
        release = "bookworm"
    elif "trixie" in tag or tag in ("latest", "slim", "3"):
        release = "trixie"
    else:
        raise refuse("only Python 3.11 (bookworm) and 3.13 (trixie) are available here")
    wanted = f"3.{minor}" if minor >= 0 else "3"
    have = _PYTHON_OF[release]
    note = f"{image} → Debian {release} with its python3 ({have}" + (
        ")" if wanted == have else f", not {wanted})"
    )
    named = next((c for c in _CODENAMES if c in tag.split("-")), None)
    differs = (named is not None and named != release) or (minor >= 0 and wanted != have)
    substituted = f"{image} built as Debian {release} (Python {have})" if differs else None
    return BaseMapping(release, True, note + pinned, substituted)

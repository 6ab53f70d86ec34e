"""A Harbor task's `environment/Dockerfile` → `ImagePlan` (the common subset, nothing more).

Supported: one `FROM` of `ubuntu:*`, `debian:*` or `python:3.11+` (slim, bookworm,
trixie variants); `RUN` (shell form, or exec form joined into a shell command); `COPY`/`ADD`
of files and folders from the build context (`--chown`/`--chmod` ignored: files belong to
root, as in Docker's default); `WORKDIR`; `ENV`; `ARG` (its default, at build time);
`USER` (recorded: the jail user is always uid 1000). `CMD`, `ENTRYPOINT`, `EXPOSE`,
`LABEL`, `VOLUME`, `HEALTHCHECK`, `STOPSIGNAL`, `SHELL`, `MAINTAINER` are ignored and
recorded. Everything else is refused with the Dockerfile line: an unknown base, `alpine`,
a second `FROM` (multi-stage), `COPY --from`, `ADD` of a URL, heredocs, `ONBUILD`.

Bases map onto the Debian releases the registry serves here: `ubuntu:24.04`/`noble`/
`latest` and `python:3.12`+ → trixie (Python 3.13); `ubuntu:22.04`/`20.04`,
`python:3.11` → bookworm (Python 3.11); `debian:<release>` → itself. Each mapping is a
recorded substitution.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from pathlib import Path

from sandbox.images import CopyStep, ImagePlan, MkdirStep, Release, RunStep, Step
from suites.harbor.errors import UnsupportedEnvironment

_IGNORED = {
    "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "SHELL", "MAINTAINER",
}  # fmt: skip
_UBUNTU: dict[str, Release] = {
    "24.04": "trixie", "noble": "trixie", "latest": "trixie", "24.10": "trixie", "25.04": "trixie",
    "22.04": "bookworm", "jammy": "bookworm", "20.04": "bookworm", "focal": "bookworm",
}  # fmt: skip
_DEBIAN: dict[str, Release] = {
    "bookworm": "bookworm", "12": "bookworm", "trixie": "trixie", "13": "trixie",
    "stable": "trixie", "latest": "trixie",
}  # fmt: skip
_PYTHON_OF: dict[Release, str] = {"bookworm": "3.11", "trixie": "3.13"}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    out: list[tuple[int, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        out.append((start, " ".join(part.strip() for part in buffer if part.strip())))
        buffer = []
    if buffer:
        out.append((start, " ".join(buffer)))
    return out


def map_base(image: str, file: Path, line: int) -> tuple[Release, bool, str]:
    """(release, is a python:* base, the substitution line) for a `FROM` image."""
    name = image.removeprefix("docker.io/").removeprefix("library/")
    repo, _, tag = name.partition(":")
    tag = tag or "latest"
    refuse = UnsupportedEnvironment
    if "alpine" in repo or "alpine" in tag:
        raise refuse(
            file,
            line,
            f"FROM {image}",
            "alpine (musl) bases are not supported; use a Debian, Ubuntu or python:* base",
        )
    if "@" in name:
        raise refuse(file, line, f"FROM {image}", "digest-pinned images are not supported")
    if repo == "ubuntu":
        mapped = _UBUNTU.get(tag)
        if mapped is None:
            raise refuse(
                file,
                line,
                f"FROM {image}",
                f"unknown ubuntu tag {tag!r} (supported: {', '.join(sorted(_UBUNTU))})",
            )
        return mapped, False, f"{image} → Debian {mapped} (minbase)"
    if repo == "debian":
        mapped = _DEBIAN.get(tag.split("-")[0])
        if mapped is None:
            raise refuse(
                file, line, f"FROM {image}", "only debian bookworm and trixie are served here"
            )
        return mapped, False, f"{image} → Debian {mapped} (minbase)"
    if repo == "python":
        match = re.match(r"^(\d+)(?:\.(\d+))?", tag)
        minor = (
            int(match.group(2))
            if match and match.group(2)
            else (13 if tag in ("latest", "3", "slim") else -1)
        )
        if "bookworm" in tag:
            release: Release = "bookworm"
        elif (
            "trixie" in tag
            or (match and match.group(1) == "3" and minor >= 12)
            or tag in ("latest", "slim", "3")
        ):
            release = "trixie"
        elif match and match.group(1) == "3" and minor == 11:
            release = "bookworm"
        else:
            raise refuse(
                file,
                line,
                f"FROM {image}",
                "only Python 3.11 (bookworm) and 3.13 (trixie) are available here",
            )
        wanted = f"3.{minor}" if minor >= 0 else "3"
        have = _PYTHON_OF[release]
        note = f"{image} → Debian {release} with its python3 ({have}" + (
            ")" if wanted == have else f", not {wanted})"
        )
        return release, True, note
    raise refuse(
        file,
        line,
        f"FROM {image}",
        "unknown base image (supported: ubuntu:*, debian:bookworm|trixie, python:3.11+)",
    )


def parse_dockerfile(path: Path, *, build_timeout_s: float = 900) -> ImagePlan:
    """The `ImagePlan` of the Dockerfile at `path` (its folder is the build context).

    Raises:
        UnsupportedEnvironment: an instruction outside the supported subset (names the line).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedEnvironment(path, None, "Dockerfile", f"cannot be read: {e}") from e
    context = path.parent
    release: Release | None = None
    python_base = False
    workdir = "/"
    env: dict[str, str] = {}
    build_args: dict[str, str] = {}
    steps: list[Step] = []
    subs: list[str] = []
    packages: set[str] = set()
    for line, instruction in _logical_lines(text):
        keyword, _, rest = instruction.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if release is None and keyword not in ("FROM", "ARG"):
            raise UnsupportedEnvironment(path, line, keyword, "comes before FROM")
        if "<<" in rest and keyword in ("RUN", "COPY", "ADD"):
            raise UnsupportedEnvironment(path, line, keyword, "heredocs are not supported")
        if keyword == "FROM":
            if release is not None:
                raise UnsupportedEnvironment(
                    path,
                    line,
                    f"FROM {rest}",
                    "multi-stage builds are not supported (one FROM only)",
                )
            words = [w for w in rest.split() if not w.startswith("--platform")]
            if not words:
                raise UnsupportedEnvironment(path, line, "FROM", "names no image")
            image = _expand(words[0], build_args)
            release, python_base, note = map_base(image, path, line)
            subs.append(note)
        elif keyword == "RUN":
            command = _exec_form(rest) or rest
            command = command if not command.startswith("--") else _strip_flags(command, path, line)
            if re.search(r"\bpip3?\b|python3? -m pip", command):
                packages.update(("python3-pip", "python3-venv"))
            steps.append(
                RunStep(line=line, command=command, workdir=workdir, env={**build_args, **env})
            )
        elif keyword in ("COPY", "ADD"):
            steps.append(_copy(keyword, rest, path, line, context, workdir))
        elif keyword == "WORKDIR":
            target = _expand(rest.strip('"'), env)
            workdir = posixpath.normpath(posixpath.join(workdir, target))
            steps.append(MkdirStep(line=line, path=workdir))
        elif keyword in ("ENV", "ARG"):
            pairs = _pairs(rest, keyword, path, line)
            (env if keyword == "ENV" else build_args).update(
                {k: _expand(v, {**build_args, **env}) for k, v in pairs.items()}
            )
        elif keyword == "USER":
            subs.append(f"USER {rest} (line {line}) → the jail user agent (uid 1000)")
        elif keyword in _IGNORED:
            subs.append(f"{keyword} (line {line}) ignored")
        else:
            raise UnsupportedEnvironment(path, line, keyword, "is not supported")
    if release is None:
        raise UnsupportedEnvironment(path, None, "FROM", "the Dockerfile has no FROM")
    if packages:
        subs.append(
            f"pip at build time: Debian {' '.join(sorted(packages))} installed, PIP_BREAK_SYSTEM_PACKAGES=1"
        )
    if workdir == "/":
        workdir = "/app"
        subs.append("no WORKDIR → /app")
    return ImagePlan(
        release=release, packages=tuple(sorted(packages)), steps=tuple(steps), context=str(context),
        workdir=workdir, env=env, python_links=python_base, substitutions=tuple(subs), source=str(path),
    )  # fmt: skip


def _expand(value: str, variables: dict[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, value)


def _exec_form(rest: str) -> str | None:
    if not rest.startswith("["):
        return None
    try:
        words = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return None
    return " ".join(shlex.quote(w) for w in words)


def _strip_flags(command: str, path: Path, line: int) -> str:
    words = command.split(" ")
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--network") and not flag.endswith("=default"):
            raise UnsupportedEnvironment(path, line, f"RUN {flag}", "is not supported")
    return " ".join(words)


def _pairs(rest: str, keyword: str, path: Path, line: int) -> dict[str, str]:
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise UnsupportedEnvironment(path, line, keyword, f"cannot be parsed: {e}") from e
    if not words:
        raise UnsupportedEnvironment(path, line, keyword, "names nothing")
    if "=" not in words[0]:
        if keyword == "ARG":
            return {words[0]: ""}
        return {words[0]: " ".join(words[1:])}
    out: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep:
            raise UnsupportedEnvironment(path, line, keyword, f"expected NAME=value, got {word!r}")
        out[name] = value
    return out


def _copy(keyword: str, rest: str, path: Path, line: int, context: Path, workdir: str) -> CopyStep:
    words = _exec_form_list(rest)
    if words is None:
        try:
            words = shlex.split(rest)
        except ValueError as e:
            raise UnsupportedEnvironment(path, line, keyword, f"cannot be parsed: {e}") from e
    flags = [w for w in words if w.startswith("--")]
    words = [w for w in words if not w.startswith("--")]
    for flag in flags:
        if flag.startswith("--from"):
            raise UnsupportedEnvironment(
                path, line, f"{keyword} {flag}", "multi-stage builds are not supported"
            )
    if len(words) < 2:
        raise UnsupportedEnvironment(path, line, keyword, "needs a source and a destination")
    *sources, dest = words
    resolved: list[str] = []
    for source in sources:
        if re.match(r"^[a-z]+://", source):
            raise UnsupportedEnvironment(
                path, line, f"{keyword} {source}", "URLs are not fetched at build time"
            )
        matches = sorted(str(m) for m in context.glob(source.lstrip("/")))
        if not matches:
            raise UnsupportedEnvironment(
                path, line, f"{keyword} {source}", f"not found in the build context {context}"
            )
        for match in matches:
            rel = (
                Path(match).resolve().relative_to(context.resolve())
                if Path(match).resolve().is_relative_to(context.resolve())
                else None
            )
            if rel is None:
                raise UnsupportedEnvironment(
                    path, line, f"{keyword} {source}", "leaves the build context"
                )
            resolved.append(rel.as_posix())
    absolute = posixpath.join(workdir, dest) if not dest.startswith("/") else dest
    target = posixpath.normpath(absolute) + ("/" if dest.endswith("/") else "")
    return CopyStep(line=line, sources=tuple(resolved), dest=target)


def _exec_form_list(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        words = json.loads(rest)
    except ValueError:
        return None
    return [str(w) for w in words] if isinstance(words, list) else None

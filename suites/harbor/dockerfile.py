"""A Harbor task's `environment/Dockerfile` → `ImagePlan` (the forms Harbor tasks use).

Supported: one `FROM` of `ubuntu:*`, `debian:*` or `python:3.11+` (slim, bookworm, trixie
variants; a digest pin is dropped and recorded); `RUN` (shell form through the `SHELL` in
force, exec form, heredocs `RUN <<EOF … EOF` and `RUN python3 <<EOF`); `COPY`/`ADD` of
files, folders (`COPY . /app`, `COPY dir/ /app/`) and globs from the build context
(`--chown`/`--chmod`/`--link` ignored: files belong to root), `COPY <<EOF /file` heredocs,
`ADD` of a local tar archive (extracted, as Docker does); `WORKDIR`; `ENV`; `ARG` (its
default); `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR:+alt}` in `FROM`, `COPY`/`ADD`,
`WORKDIR`, `ENV`, `ARG`; `USER` (recorded: the jail user is always uid 1000); `SHELL`.
`CMD`, `ENTRYPOINT`, `EXPOSE`, `LABEL`, `VOLUME`, `HEALTHCHECK`, `STOPSIGNAL`,
`MAINTAINER`, `ONBUILD` are ignored and recorded.

Everything else is refused with the Dockerfile line and a `RefusalCategory`: `base-image`
(an unknown or unserved base, `alpine`, a multi-stage build's second image),
`network-build` (`ADD <url>`, a `RUN` that fetches from the internet: `network.py`),
`malformed` (an unknown instruction, a line that cannot be parsed, no `FROM`).

Bases map onto the Debian releases served here (`bases.py`); each mapping is a recorded
substitution, and one that builds another distribution, codename or Python than the tag
names is the plan's `base_substitution`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from pathlib import Path

from sandbox.images import CopyStep, ImagePlan, MkdirStep, Release, RunStep, Step
from suites.harbor.bases import map_base
from suites.harbor.errors import RefusalCategory, UnsupportedEnvironment
from suites.harbor.network import build_fetch, build_script_fetch

_IGNORED = {
    "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "MAINTAINER",
    "ONBUILD",
}  # fmt: skip
_DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""What `$PATH` in an `ENV` expands to before any `ENV PATH` (the images' default)."""
_HEREDOC = re.compile(r"(?:^|(?<=\s))<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_ARCHIVE = re.compile(r"\.(tar|tar\.gz|tgz|tar\.bz2|tbz2?|tar\.xz|txz|tar\.zst)$")
_GLOB = re.compile(r"[*?\[]")
BASE = RefusalCategory.BASE_IMAGE
NETWORK = RefusalCategory.NETWORK_BUILD
_WORD = re.compile(r"[^\s;&|()<>'\"`=]+")
"""A word of a shell command that may name a file."""
_CD = re.compile(r"\bcd\s+([^\s;&|]+)")
_SCRIPT_CAP = 1_000_000
"""Characters of a build-context script read for fetches."""


class Instruction:
    """One Dockerfile instruction: its first line, text and heredoc bodies (in order)."""

    def __init__(self, line: int, text: str, heredocs: list[tuple[str, str, bool]]) -> None:
        self.line = line
        self.text = text
        self.heredocs = heredocs
        """(delimiter, body, quoted) of each `<<DELIM` of the instruction, in order."""


def instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile: continuations joined, comments dropped, heredoc
    bodies (`<<EOF` … `EOF` after a `RUN`, `COPY` or `ADD`) collected."""
    lines = text.splitlines()
    out: list[Instruction] = []
    buffer: list[str] = []
    start, index = 0, 0
    while index < len(lines):
        number, stripped = index + 1, lines[index].strip()
        index += 1
        if not stripped or stripped.startswith("#"):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        joined = " ".join(part for part in buffer if part)
        buffer = []
        heredocs: list[tuple[str, str, bool]] = []
        if joined.split(" ", 1)[0].upper() in ("RUN", "COPY", "ADD"):
            for match in _HEREDOC.finditer(joined):
                strip_tabs, delimiter = match.group(1) == "-", match.group(3)
                body: list[str] = []
                end = index
                while end < len(lines):
                    raw = lines[end].lstrip("\t") if strip_tabs else lines[end]
                    end += 1
                    if raw.rstrip() == delimiter:
                        break
                    body.append(raw)
                else:  # never closed: not a heredoc (e.g. `x <<y` inside a quoted one-liner)
                    break
                index = end
                heredocs.append((delimiter, "\n".join(body) + "\n", bool(match.group(2))))
        out.append(Instruction(start, joined, heredocs))
    if buffer:
        out.append(Instruction(start, " ".join(buffer), []))
    return out


class _Parser:
    """The state of one Dockerfile as its instructions are read in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.context = path.parent
        self.release: Release | None = None
        self.python_base = False
        self.base_substitution: str | None = None
        self.workdir = "/"
        self.env: dict[str, str] = {}
        self.args: dict[str, str] = {}
        self.shell: list[str] | None = None
        self.steps: list[Step] = []
        self.subs: list[str] = []
        self.packages: set[str] = set()
        self.ignored_flags: dict[str, list[int]] = {}

    def refuse(
        self,
        line: int,
        instruction: str,
        message: str,
        category: RefusalCategory = RefusalCategory.MALFORMED,
    ) -> UnsupportedEnvironment:
        return UnsupportedEnvironment(self.path, line, instruction, message, category=category)

    def expand(self, value: str) -> str:
        return expand(value, {**_DEFAULT_ENV, **self.args, **self.env})

    def instruction(self, item: Instruction) -> None:
        keyword, _, rest = item.text.partition(" ")
        keyword, rest, line = keyword.upper(), rest.strip(), item.line
        if self.release is None and keyword not in ("FROM", "ARG"):
            raise self.refuse(line, keyword, "comes before FROM")
        if keyword == "FROM":
            self.from_(line, rest)
        elif keyword == "RUN":
            self.run(item, rest)
        elif keyword in ("COPY", "ADD"):
            self.steps += self.copy(keyword, item, rest)
        elif keyword == "WORKDIR":
            target = self.expand(_unquote(rest))
            self.workdir = posixpath.normpath(posixpath.join(self.workdir, target))
            self.steps.append(MkdirStep(line=line, path=self.workdir))
        elif keyword in ("ENV", "ARG"):
            pairs = _pairs(rest, keyword, self.path, line)
            for key, value in pairs.items():
                if keyword == "ARG" and key in self.args and not value:
                    continue  # a redeclared ARG keeps its default
                (self.env if keyword == "ENV" else self.args)[key] = self.expand(value)
        elif keyword == "USER":
            self.subs.append(f"USER {rest} (line {line}) → the jail user agent (uid 1000)")
        elif keyword == "SHELL":
            shell = _exec_form_list(rest)
            if not shell:
                raise self.refuse(line, "SHELL", 'expects the JSON form, e.g. ["/bin/bash", "-c"]')
            self.shell = shell
        elif keyword in _IGNORED:
            self.subs.append(f"{keyword} (line {line}) ignored")
        else:
            raise self.refuse(line, keyword, "is not a Dockerfile instruction epiflow knows")

    def from_(self, line: int, rest: str) -> None:
        if self.release is not None:
            raise self.refuse(
                line, f"FROM {rest}", "multi-stage builds are not supported (one FROM only)", BASE
            )
        words = [w for w in rest.split() if not w.startswith("--platform")]
        if not words:
            raise self.refuse(line, "FROM", "names no image")
        image = expand(words[0], self.args)
        if image == "scratch":
            raise self.refuse(line, "FROM scratch", "an empty base cannot run a jail", BASE)
        base = map_base(image, self.path, line)
        self.release, self.python_base, self.base_substitution = (
            base.release, base.python_base, base.substituted,
        )  # fmt: skip
        self.subs.append(base.note)
        if self.python_base:  # the official image ships CPython's headers: C extensions build
            self.packages.add("python3-dev")

    def run(self, item: Instruction, rest: str) -> None:
        line = item.line
        exec_form = _exec_form(rest)
        command = exec_form or rest
        if not exec_form and command.startswith("--"):
            command = _strip_flags(command, self.path, line)
        if item.heredocs:
            command = self.heredoc_command(line, command, item.heredocs)
        elif self.shell and not exec_form:
            command = shlex.join([*self.shell, command])
        fetch = (
            build_fetch(command) or build_fetch(self.expand(command)) or self.script_fetch(command)
        )
        if fetch:
            raise self.refuse(
                line, f"RUN {command.splitlines()[0][:80]}",
                f"{fetch} needs the internet at build time (only the package registries are reached)",
                NETWORK,
            )  # fmt: skip
        if re.search(r"\bpip3?\b|python3? -m pip", command):
            self.packages.update(("python3-pip", "python3-venv"))
        self.steps.append(
            RunStep(line=line, command=command, workdir=self.workdir, env={**self.args, **self.env})
        )

    def script_fetch(self, command: str) -> str | None:
        """What a build-context script that `command` runs fetches from the internet
        (`network.build_script_fetch`): a word of the command naming a file an earlier
        `COPY` put in the image, from the step's workdir or a `cd` in the command."""
        folders = [self.workdir, *(m for m in _CD.findall(command) if m.startswith("/"))]
        for word in _WORD.findall(command):
            if "/" not in word and "." not in word:
                continue
            for folder in folders:
                path = posixpath.normpath(posixpath.join(folder, word))
                source = self.copied_file(path)
                if source is None:
                    continue
                try:
                    text = source.read_text(encoding="utf-8", errors="replace")[:_SCRIPT_CAP]
                except OSError:
                    continue
                found = build_script_fetch(text)
                if found:
                    name = source.relative_to(self.context).as_posix()
                    return f"{found[1]} (in {name}, line {found[0]}, which the step runs)"
        return None

    def copied_file(self, image_path: str) -> Path | None:
        """The build-context file the latest `COPY`/`ADD` put at `image_path`, if any."""
        for step in reversed(self.steps):
            if not isinstance(step, CopyStep):
                continue
            dest = step.dest.rstrip("/") or "/"
            for source in step.sources:
                local = self.context / source
                if local.is_dir():
                    rest = posixpath.relpath(image_path, dest)
                    if not rest.startswith("..") and rest != "." and (local / rest).is_file():
                        return local / rest
                elif image_path in (dest, posixpath.join(dest, local.name)):
                    return local
        return None

    def heredoc_command(self, line: int, command: str, docs: list[tuple[str, str, bool]]) -> str:
        if command.startswith("<<"):  # `RUN <<EOF`: the body is the script
            if len(docs) != 1 or _HEREDOC.sub("", command).strip():
                raise self.refuse(
                    line, "RUN <<", "a heredoc script takes one heredoc and nothing else"
                )
            delimiter, body, _ = docs[0]
            if body.startswith("#!"):
                interpreter = body.splitlines()[0][2:].strip()
                return f"{interpreter} <<'{delimiter}'\n{body}{delimiter}"
            return shlex.join([*self.shell, body]) if self.shell else body
        # `RUN python3 <<EOF` (or `cat <<EOF > f`): the shell reads the heredocs as written
        script = command + "\n" + "".join(f"{body}{delimiter}\n" for delimiter, body, _ in docs)
        return shlex.join([*self.shell, script]) if self.shell else script

    def copy(self, keyword: str, item: Instruction, rest: str) -> list[Step]:
        line = item.line
        words = _exec_form_list(rest)
        if words is None:
            try:
                words = shlex.split(rest)
            except ValueError as e:
                raise self.refuse(line, keyword, f"cannot be parsed: {e}") from e
        for flag in (w for w in words if w.startswith("--")):
            name = flag.split("=", 1)[0]
            if name == "--from":
                raise self.refuse(
                    line, f"{keyword} {flag}", "multi-stage builds are not supported", BASE
                )
            if name not in ("--chown", "--chmod", "--link", "--checksum", "--keep-git-dir"):
                raise self.refuse(line, f"{keyword} {flag}", "is not supported")
            self.ignored_flags.setdefault(name, []).append(line)
        words = [self.expand(w) for w in words if not w.startswith("--")]
        if len(words) < 2:
            raise self.refuse(line, keyword, "needs a source and a destination")
        *sources, dest = words
        absolute = dest if dest.startswith("/") else posixpath.join(self.workdir, dest)
        target = posixpath.normpath(absolute) + ("/" if dest.endswith("/") else "")
        steps: list[Step] = []
        files: list[str] = []
        docs = iter(item.heredocs)
        for source in sources:
            if source.startswith("<<"):
                delimiter, body, quoted = next(docs, ("", "", True))
                steps.append(self.heredoc_file(line, target, delimiter, body, quoted))
            elif re.match(r"^[a-z][a-z0-9+.-]*://|^git@", source):
                raise self.refuse(
                    line, f"{keyword} {source}", "fetches from the internet at build time", NETWORK
                )
            else:
                files += self.resolve(keyword, line, source)
        archives = [f for f in files if keyword == "ADD" and _ARCHIVE.search(f)]
        plain = [f for f in files if f not in archives]
        if plain:
            steps.append(CopyStep(line=line, sources=tuple(plain), dest=target))
        for archive in archives:  # ADD extracts a local tar archive, as Docker does
            staged = f"/tmp/.epiflow-add-{line}/{posixpath.basename(archive)}"
            steps.append(CopyStep(line=line, sources=(archive,), dest=staged))
            folder = shlex.quote(target.rstrip("/") or "/")
            steps.append(RunStep(
                line=line, workdir="/", env={},
                command=f"mkdir -p {folder} && tar -xf {shlex.quote(staged)} -C {folder} && "
                f"rm -rf {shlex.quote(posixpath.dirname(staged))}",
            ))  # fmt: skip
        return steps

    def heredoc_file(
        self, line: int, target: str, delimiter: str, body: str, quoted: bool
    ) -> RunStep:
        if not delimiter:
            raise self.refuse(line, "COPY <<", "a heredoc source without its body")
        path = target + delimiter if target.endswith("/") else target
        marker = f"'{delimiter}'" if quoted else delimiter
        return RunStep(
            line=line, workdir="/", env={**self.args, **self.env},
            command=f"mkdir -p {shlex.quote(posixpath.dirname(path))} && "
            f"cat > {shlex.quote(path)} <<{marker}\n{body}{delimiter}",
        )  # fmt: skip

    def resolve(self, keyword: str, line: int, source: str) -> list[str]:
        """Context-relative paths of `source` (`.`, a file, a folder, a glob)."""
        pattern = posixpath.normpath(source.lstrip("/") or ".")
        if pattern == ".." or pattern.startswith("../"):
            raise self.refuse(line, f"{keyword} {source}", "leaves the build context")
        context = self.context.resolve()
        if _GLOB.search(pattern):
            matches = sorted(self.context.glob(pattern))
        else:
            matches = [self.context / pattern] if (self.context / pattern).exists() else []
        if not matches:
            raise self.refuse(
                line, f"{keyword} {source}", f"not found in the build context {self.context}"
            )
        out: list[str] = []
        for match in matches:
            resolved = match.resolve()
            if not resolved.is_relative_to(context):
                raise self.refuse(line, f"{keyword} {source}", "leaves the build context")
            out.append(resolved.relative_to(context).as_posix() or ".")
        return out


def parse_dockerfile(path: Path, *, build_timeout_s: float = 900) -> ImagePlan:
    """The `ImagePlan` of the Dockerfile at `path` (its folder is the build context).

    Raises:
        UnsupportedEnvironment: an instruction outside the supported subset (names the line
            and its `RefusalCategory`).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedEnvironment(path, None, "Dockerfile", f"cannot be read: {e}") from e
    parser = _Parser(path)
    for item in instructions(text):
        parser.instruction(item)
    if parser.release is None:
        raise UnsupportedEnvironment(path, None, "FROM", "the Dockerfile has no FROM")
    subs = parser.subs
    for flag, lines in parser.ignored_flags.items():
        subs.append(
            f"COPY/ADD {flag} ignored (lines {', '.join(map(str, lines))}): files belong to root"
        )
    if parser.packages:
        subs.append(
            f"pip at build time: Debian {' '.join(sorted(parser.packages))} installed, PIP_BREAK_SYSTEM_PACKAGES=1"
        )
    workdir = parser.workdir
    if workdir == "/":
        workdir = "/app"
        subs.append("no WORKDIR → /app")
    return ImagePlan(
        release=parser.release, packages=tuple(sorted(parser.packages)), steps=tuple(parser.steps),
        context=str(parser.context), workdir=workdir, env=parser.env, python_links=parser.python_base,
        substitutions=tuple(subs), base_substitution=parser.base_substitution, source=str(path),
    )  # fmt: skip


def expand(value: str, variables: dict[str, str]) -> str:
    """`value` with `$VAR`, `${VAR}`, `${VAR:-default}` and `${VAR:+alt}` substituted as
    Docker does (unknown: empty); `\\$` stays a literal `$`."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        name = match.group(1) or match.group(4)
        current = variables.get(name, "")
        if match.group(2) in (":-", "-"):
            return (
                current
                if current or (match.group(2) == "-" and name in variables)
                else match.group(3)
            )
        if match.group(2) in (":+", "+"):
            return (
                match.group(3) if current or (match.group(2) == "+" and name in variables) else ""
            )
        return current

    return re.sub(r"\\\$|\$\{(\w+)(?:(:?[-+])([^}]*))?\}|\$(\w+)", sub, value)


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'" else text


def _exec_form(rest: str) -> str | None:
    words = _exec_form_list(rest)
    return shlex.join(words) if words else None


def _strip_flags(command: str, path: Path, line: int) -> str:
    words = command.split(" ")
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--network") and flag.split("=", 1)[-1] not in ("default", "none"):
            raise UnsupportedEnvironment(
                path,
                line,
                f"RUN {flag}",
                "needs the host's network at build time",
                category=NETWORK,
            )
    return " ".join(words)


def _pairs(rest: str, keyword: str, path: Path, line: int) -> dict[str, str]:
    try:
        words = shlex.split(rest, posix=True)
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


def _exec_form_list(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        words = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        return None
    return words

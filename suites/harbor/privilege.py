"""What in a Harbor task's reference solution needs root: the one place this rule lives.

Harbor runs the agent (and its oracle, `solution/solve.sh`) as root in the task's
container, and the verifier in that same container afterwards. epiflow's agent is an
unprivileged user (uid 1000) in a read-only image, and its verifier starts in a fresh
jail that only the workdir reaches. A solution that manages users (`useradd`,
`chpasswd`), gives files to another user (`chown`, `chgrp`) or starts system services
(`service`, `systemctl`, `sshd`) for the verifier to find cannot work there, however
right it is; such a task is refused up front (`needs-root`), never scored as the agent's
failure.

Why not run the agent as uid 0 inside its user namespace (nsjail maps an inside uid to
the outside user): that uid has no capabilities over the image (a read-only bind owned by
the real root), only one uid is mapped (a `chown` to any other user is `EINVAL`), and the
services it starts die with the agent's jail before the verifier's starts. Making that
work needs a writable root layer, a mapped uid range and a verifier in the agent's own
jail: a different sandbox, not a flag.

Commands are matched where a command starts (a line, or after `;`, `&&`, `||`, `|`,
`sudo`, `then`, `do`), outside comments and heredoc bodies (a file the script writes).

The verifier likewise (`verifier_root`): Harbor runs `tests/` as root in the container, and
some tests need it — `chroot /jail …`, or `mkdir /server` at the image's root. epiflow's
verifier jail is the same unprivileged user in the same read-only image (writable: the
workdir and the jail's tmpfs mounts), so such a task is refused too. Those are matched in
every text file of `tests/` (Python's `subprocess` lists and shell strings included).
"""

from __future__ import annotations

import re
from pathlib import Path

from suites.harbor.texts import folder_texts

_ROOT_COMMAND = re.compile(
    r"(?:^|[;&|]\s*|\b(?:sudo|then|do|else|exec)\s+)"
    r"(?:/usr)?(?:/s?bin/)?"
    r"(useradd|adduser|groupadd|addgroup|usermod|userdel|chpasswd|chown|chgrp|service|systemctl|sshd)\b"
)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def script_root(text: str) -> tuple[int, str] | None:
    """(line, command) of the first command of a shell script that needs root; None when
    it has none."""
    ending: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if ending is not None:
            if line.strip() == ending:
                ending = None
            continue
        stripped = line.lstrip()
        if stripped.startswith("#"):
            continue
        match = _ROOT_COMMAND.search(stripped)
        if match:
            return number, match.group(1)
        heredoc = _HEREDOC.search(stripped)
        if heredoc:
            ending = heredoc.group(2)
    return None


def solution_root(task_dir: Path) -> tuple[Path, int, str] | None:
    """(file, line, command) of the first command of `solution/solve.sh` that needs root."""
    path = task_dir / "solution" / "solve.sh"
    if not path.is_file():
        return None
    found = script_root(path.read_text(encoding="utf-8", errors="replace"))
    return (path, *found) if found else None


_CHROOT = re.compile(r"\bchroot[\s\"',]+(/[^\s\"';]*)")
_MKDIR = re.compile(r"\bmkdir[\s\"',]+(?:-p[\s\"',]+)?(/[^\s\"';]+)")


def verifier_root(tests_dir: Path, writable: tuple[str, ...]) -> tuple[Path, int, str] | None:
    """(file, line, what) of the first thing in `tests/` that needs root in the verifier
    jail: a `chroot`, or a `mkdir` of an absolute path under none of the `writable` paths."""
    for path, text in folder_texts(tests_dir):
        for number, line in enumerate(text.splitlines(), 1):
            chroot = _CHROOT.search(line)
            if chroot:
                return path, number, f"chroot {chroot.group(1)}"
            for made in _MKDIR.finditer(line):
                target = made.group(1).rstrip("/)]")
                if not any(target == w or target.startswith(w.rstrip("/") + "/") for w in writable):
                    return path, number, f"mkdir {target}"
    return None

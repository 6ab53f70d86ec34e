"""Directory tree from a spec (difficulty 1): create the folders and empty files listed in the prompt."""

from __future__ import annotations

import random
import shlex

from suites.builtin.common import WORDS, list_dir, python_verifier, shell
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    checks = Checks()
    for path in EXPECTED["dirs"]:
        checks.add(f"{path}/ is a directory", os.path.isdir(path))
    for path in EXPECTED["files"]:
        checks.add(f"{path} is an empty file", os.path.isfile(path) and os.path.getsize(path) == 0)
    return checks.verdict()
"""

_LAYOUT_DIRS = ("src", "tests", "docs", "scripts", "data/raw", "data/clean", "config", "assets/img")
_LAYOUT_FILES = {
    "src": ("__init__.py", "main.py", "util.py"),
    "tests": ("test_main.py", "conftest.py"),
    "docs": ("index.md", "usage.md"),
    "scripts": ("build.sh", "deploy.sh"),
    "data/raw": (".keep",),
    "data/clean": (".keep",),
    "config": ("app.toml", "logging.ini"),
    "assets/img": ("logo.svg",),
}


def build(rng: random.Random) -> TaskDraft:
    root = rng.choice(WORDS) + "_project"
    chosen = sorted(rng.sample(_LAYOUT_DIRS, rng.randint(3, 5)))
    dirs = [f"{root}/{d}" for d in chosen]
    files = [f"{root}/{d}/{rng.choice(_LAYOUT_FILES[d])}" for d in chosen]
    files.append(f"{root}/README.md")
    spec_lines = [f"  {d}/" for d in dirs] + [f"  {f}" for f in files]
    prompt = (
        "In /workspace, create this layout (paths ending in / are directories, the others are "
        "empty files):\n" + "\n".join(spec_lines)
    )
    command = "mkdir -p " + " ".join(shlex.quote(d) for d in dirs)
    command += " && touch " + " ".join(shlex.quote(f) for f in files)
    return TaskDraft(
        prompt=prompt,
        files={},
        reference_solution=[shell(command), list_dir(root)],
        reference_final=f"Created {len(dirs)} directories and {len(files)} files under {root}/.",
        verifier=python_verifier(_VERIFY, {"dirs": dirs, "files": files}),
    )


TEMPLATE = TaskTemplate(
    name="dir_tree",
    version="1",
    difficulty=1,
    summary="create the directories and empty files listed in the prompt",
    build=build,
)

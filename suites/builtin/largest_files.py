"""Find the largest files (difficulty 3): top three under data/, hidden folders included."""

from __future__ import annotations

import random

from suites.builtin.common import WORDS, python_shell, python_verifier, read
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    lines = [line.removeprefix("/workspace/").removeprefix("./") for line in read_lines("largest.txt")]
    want = EXPECTED["top"]
    if not set(lines) & set(want):
        raise Reject("largest.txt names none of the largest files")
    checks = Checks()
    checks.add("exactly three lines", len(lines) == 3)
    for i, path in enumerate(want):
        checks.add(f"line {i + 1} is {path}", len(lines) > i and lines[i] == path)
    return checks.verdict()
"""

_SOLVE = """
import os
sizes = []
for root, dirs, files in os.walk("data"):
    for name in files:
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            sizes.append((os.path.getsize(path), path))
sizes.sort(reverse=True)
with open("largest.txt", "w") as f:
    f.write("".join(p + "\\n" for _, p in sizes[:3]))
for size, path in sizes[:5]:
    print(size, path)
"""


def build(rng: random.Random) -> TaskDraft:
    folders = ["data", "data/logs", "data/exports", "data/exports/2024", "data/.cache"]
    names = rng.sample(WORDS, 12)
    sizes = rng.sample(range(200, 6000), 12)
    files: dict[str, str] = {}
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        folder = folders[i % len(folders)]
        ext = rng.choice([".log", ".csv", ".bin", ".txt"])
        files[f"{folder}/{name}{ext}"] = "x" * size
    # The trap: the largest file lives in a hidden folder; shallow listings miss it.
    hidden = f"data/.cache/{rng.choice(WORDS)}-blob.bin"
    files[hidden] = "y" * (max(sizes) + rng.randint(100, 900))
    ranked = sorted(files, key=lambda p: len(files[p]), reverse=True)
    top = ranked[:3]
    prompt = (
        "Find the three largest files (by size in bytes) anywhere under /workspace/data, hidden "
        "folders included. Write their paths relative to /workspace (like data/x/y.csv) to "
        "largest.txt, largest first, one per line."
    )
    return TaskDraft(
        prompt=prompt,
        files=files,
        reference_solution=[python_shell(_SOLVE), read("largest.txt")],
        reference_final="The largest files are: " + ", ".join(top),
        verifier=python_verifier(_VERIFY, {"top": top}),
    )


TEMPLATE = TaskTemplate(
    name="largest_files",
    version="1",
    difficulty=3,
    summary="list the three largest files in a tree, including a hidden folder",
    build=build,
)

"""Verify checksums (difficulty 3): report corrupted and missing files; ignore unlisted extras.

Two reference solutions (`either_reference`): run `sha256sum -c` and write the names it
failed, or one pipeline that writes them (`sha256sum -c --quiet` prints only the
failures). Version 2 added the pipeline; the tasks are version 1's.
"""

from __future__ import annotations

import hashlib
import random

from suites.builtin.common import WORDS, either_reference, python_verifier, read, shell, write
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    lines = read_lines("bad_files.txt")
    names = [os.path.basename(line.split()[-1]) for line in lines]
    want = EXPECTED["bad"]
    if not set(names) & set(want):
        raise Reject("bad_files.txt names none of the bad files")
    checks = Checks()
    for name in want:
        checks.add(f"{name} reported", name in names)
    checks.add("no good or unlisted file reported", set(names) <= set(want))
    checks.add("sorted, one per line, no duplicates", names == sorted(set(names)))
    return checks.verdict()
"""


def build(rng: random.Random) -> TaskDraft:
    names = sorted(
        f"{w}.{rng.choice(['tar', 'iso', 'zip', 'img'])}"
        for w in rng.sample(WORDS, rng.randint(5, 7))
    )
    contents = {
        name: f"payload {name} {rng.getrandbits(64):016x}\n" * rng.randint(1, 20) for name in names
    }
    sums = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in contents.items()}
    corrupted = rng.sample(names, rng.randint(1, 2))
    missing = rng.choice([n for n in names if n not in corrupted])
    files: dict[str, str] = {}
    for name, text in contents.items():
        if name == missing:
            continue
        files[f"downloads/{name}"] = (
            text.replace("payload", "pay1oad", 1) if name in corrupted else text
        )
    files["downloads/SHA256SUMS"] = "".join(f"{sums[name]}  {name}\n" for name in names)
    files[f"downloads/{rng.choice(WORDS)}-extra.txt"] = "not listed in SHA256SUMS\n"
    bad = sorted([*corrupted, missing])
    prompt = (
        "Check the files in /workspace/downloads against downloads/SHA256SUMS. Write "
        "bad_files.txt (in /workspace) listing the name of every file listed in SHA256SUMS whose "
        "checksum does not match or which is missing, sorted alphabetically, one per line."
    )
    return TaskDraft(
        prompt=prompt,
        files=files,
        reference_solution=either_reference(
            rng,
            transcribing=[
                shell("cd downloads && sha256sum -c SHA256SUMS"),
                write("bad_files.txt", "".join(f"{name}\n" for name in bad)),
            ],
            computing=[
                shell(
                    "cd downloads && sha256sum -c --quiet SHA256SUMS 2>/dev/null "
                    "| cut -d: -f1 | sort > ../bad_files.txt"
                ),
                read("bad_files.txt"),
            ],
        ),
        reference_final=f"{len(bad)} bad files: {', '.join(bad)}.",
        verifier=python_verifier(_VERIFY, {"bad": bad}),
    )


TEMPLATE = TaskTemplate(
    name="checksums",
    version="2",
    difficulty=3,
    summary="verify SHA256SUMS and report corrupted and missing files",
    build=build,
)

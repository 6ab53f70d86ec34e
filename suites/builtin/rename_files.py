"""Rename files by pattern (difficulty 3): IMG_<digits>.jpg → <prefix>_<digits>.jpg, decoys untouched.

Two reference solutions (`either_reference`): one `mv` per file, names typed out, or a
Python script that renames the names matching the pattern. Version 2 added the script;
the tasks are version 1's.
"""

from __future__ import annotations

import random
import shlex

from suites.builtin.common import either_reference, list_dir, python_shell, python_verifier, shell
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    folder = EXPECTED["folder"]
    if not os.path.isdir(folder):
        raise Reject(f"{folder}/ is gone")
    renamed = EXPECTED["renamed"]
    if not any(os.path.isfile(os.path.join(folder, new)) for new in renamed.values()):
        raise Reject("no file was renamed")
    checks = Checks()
    for old, new in renamed.items():
        path = os.path.join(folder, new)
        ok = os.path.isfile(path) and read_text(path) == EXPECTED["content"][old]
        checks.add(f"{old} renamed to {new}", ok and not os.path.exists(os.path.join(folder, old)))
    for name in EXPECTED["decoys"]:
        path = os.path.join(folder, name)
        checks.add(f"{name} untouched", os.path.isfile(path) and read_text(path) == EXPECTED["content"][name])
    expected_names = set(renamed.values()) | set(EXPECTED["decoys"])
    checks.add("no other files in the folder", set(os.listdir(folder)) == expected_names)
    return checks.verdict()
"""

_RENAME = """
import os, re
for name in os.listdir("{folder}"):
    match = re.fullmatch(r"IMG_(\\d+)\\.jpg", name)
    if match:
        os.rename(f"{folder}/{{name}}", f"{folder}/{prefix}_{{match.group(1)}}.jpg")
"""


def build(rng: random.Random) -> TaskDraft:
    folder = rng.choice(["photos", "camera", "pictures"])
    prefix = rng.choice(["holiday", "trip", "beach", "party", "wedding"])
    numbers = rng.sample(range(1, 9999), 6)
    originals = [f"IMG_{n:04d}.jpg" for n in numbers[:4]]
    decoys = [
        f"IMG_{numbers[4]:04d}.png",
        f"img_{numbers[5]:04d}.jpg",
        f"IMG_{numbers[0]:04d}.jpg.bak",
        f"IMG_{rng.choice(['draft', 'x1', 'copy'])}.jpg",
        "notes.txt",
    ]
    content = {name: f"fake image bytes {rng.getrandbits(32):08x}\n" for name in originals + decoys}
    renamed = {old: f"{prefix}_{old[4:8]}.jpg" for old in originals}
    prompt = (
        f"In /workspace/{folder}, rename every file named IMG_<digits>.jpg (exactly: upper-case "
        f"IMG_, only digits, .jpg) to {prefix}_<digits>.jpg, keeping the digits. Leave every other "
        "file as it is."
    )
    moves = " && ".join(
        f"mv {shlex.quote(f'{folder}/{old}')} {shlex.quote(f'{folder}/{new}')}"
        for old, new in renamed.items()
    )
    return TaskDraft(
        prompt=prompt,
        files={f"{folder}/{name}": text for name, text in content.items()},
        reference_solution=either_reference(
            rng,
            transcribing=[list_dir(folder), shell(moves), list_dir(folder)],
            computing=[
                list_dir(folder),
                python_shell(_RENAME.format(folder=folder, prefix=prefix)),
                list_dir(folder),
            ],
        ),
        reference_final=f"Renamed {len(renamed)} files.",
        verifier=python_verifier(
            _VERIFY, {"folder": folder, "renamed": renamed, "decoys": decoys, "content": content}
        ),
    )


TEMPLATE = TaskTemplate(
    name="rename_files",
    version="2",
    difficulty=3,
    summary="rename IMG_<digits>.jpg files by a pattern, leaving look-alike decoys alone",
    build=build,
)

"""Verifier of `textops/sort_names`: sorted.txt must hold the distinct names, sorted.

Partial credit: 0.5 when the right names are there but not sorted or duplicated.
"""

import json
from pathlib import Path

EXPECTED = ["ada", "barbara", "grace", "linus"]


def main() -> None:
    path = Path("sorted.txt")
    if not path.is_file():
        verdict: dict[str, object] = {"score": 0.0, "reason": "sorted.txt does not exist"}
    else:
        names = [
            n.strip()
            for n in path.read_text(encoding="utf-8", errors="replace").splitlines()
            if n.strip()
        ]
        if names == EXPECTED:
            verdict = {"score": 1.0, "reason": "names sorted and distinct"}
        elif sorted(set(names)) == EXPECTED:
            verdict = {"score": 0.5, "reason": "right names, but not sorted or not distinct"}
        else:
            verdict = {"score": 0.0, "reason": f"expected {EXPECTED}, got {names[:10]}"}
    print(json.dumps(verdict))  # noqa: T201


main()

"""Verifier of `textops/count_words`: count.txt must hold the word count of poem.txt.

Runs inside the jail (cwd /workspace) and prints {"score": …, "reason": …}.
"""

import json
from pathlib import Path

EXPECTED_WORDS = 27


def main() -> None:
    path = Path("count.txt")
    if not path.is_file():
        verdict = {"score": 0.0, "reason": "count.txt does not exist"}
    elif path.read_text(encoding="utf-8", errors="replace").strip() == str(EXPECTED_WORDS):
        verdict = {"score": 1.0, "reason": f"count is {EXPECTED_WORDS}"}
    else:
        verdict = {"score": 0.0, "reason": "count.txt holds the wrong number"}
    print(json.dumps(verdict))  # noqa: T201


main()

"""Verifier of `textops/numbers_above`: the output file holds the numbers above the threshold.

The values drawn for this seed (numbers, threshold, out) come from
/tmp/epiflow-verifier/params.json, written by epiflow next to the verifier's files; the
output file's name is also the first argument. Prints {"score": …, "reason": …}.
"""

import json
import sys
from pathlib import Path


def main() -> None:
    values = json.loads(Path("/tmp/epiflow-verifier/params.json").read_text(encoding="utf-8"))
    expected = sorted(n for n in values["numbers"] if n > values["threshold"])
    path = Path(sys.argv[1])
    if not path.is_file():
        verdict = {"score": 0.0, "reason": f"{path} does not exist"}
    else:
        lines = path.read_text(encoding="utf-8", errors="replace").split()
        if lines == [str(n) for n in expected]:
            verdict = {"score": 1.0, "reason": f"{len(expected)} number(s), sorted"}
        else:
            verdict = {"score": 0.0, "reason": f"expected {expected[:8]}…, got {lines[:8]}…"}
    print(json.dumps(verdict))  # noqa: T201


main()

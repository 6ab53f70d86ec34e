"""Verifier of `textops/invoice_total`: total.txt holds the generator's total, two decimals.

The expected total comes from params.json (what the generator returned for this seed).
"""

import json
from pathlib import Path


def main() -> None:
    values = json.loads(Path("/tmp/epiflow-verifier/params.json").read_text(encoding="utf-8"))
    path = Path("total.txt")
    if not path.is_file():
        verdict = {"score": 0.0, "reason": "total.txt does not exist"}
    elif path.read_text(encoding="utf-8", errors="replace").strip() == values["total"]:
        verdict = {"score": 1.0, "reason": f"total of {values['customer']} is {values['total']}"}
    else:
        verdict = {"score": 0.0, "reason": "total.txt holds the wrong amount"}
    print(json.dumps(verdict))  # noqa: T201


main()

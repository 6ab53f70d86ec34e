"""Generator of `textops/invoice_total`: a seeded invoices.csv and the expected total.

Runs inside a jail (cwd /workspace, which holds this script and customers.txt at their
suite-folder paths). Reads {"seed": …, "params": {…}} on stdin and prints one JSON object:
{"params": {"customer": …, "total": …}, "files": {"invoices.csv": …}}.
"""

import json
import random
import sys
from pathlib import Path

STATUSES = ["paid", "paid", "paid", "open", "void"]


def main() -> None:
    request = json.loads(sys.stdin.readline())
    rng = random.Random(request["seed"])  # every choice from the seed: same seed, same task
    names = Path("generators/customers.txt").read_text(encoding="utf-8").splitlines()
    customers = rng.sample(names, rng.randint(3, 5))
    customer = customers[0]
    rows = ["id,customer,amount,status"]
    total_cents = 0
    for number in range(rng.randint(10, 24)):
        who = customer if number < 3 else rng.choice(customers)
        cents = rng.randint(500, 250_000)
        status = rng.choice(STATUSES)
        rows.append(f"INV-{1000 + number},{who},{cents // 100}.{cents % 100:02d},{status}")
        if who == customer and status != "void":
            total_cents += cents
    total = f"{total_cents // 100}.{total_cents % 100:02d}"
    files = {"invoices.csv": "\n".join(rows) + "\n"}
    print(json.dumps({"params": {"customer": customer, "total": total}, "files": files}))  # noqa: T201


main()

"""Roll up regional sales (difficulty 5): semicolon exports, thousands separators, bad rows, an archive."""

from __future__ import annotations

import json
import random

from suites.builtin.common import (
    ITEMS,
    csv_text,
    list_dir,
    python_shell,
    python_verifier,
    random_dates,
    read,
)
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def close(got, want):
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) <= 0.011


def verify():
    report = read_json("report.json")
    if not isinstance(report, dict) or not isinstance(report.get("totals"), dict):
        raise Reject('report.json must be an object with a "totals" object')
    totals = report["totals"]
    want = EXPECTED["totals"]
    checks = Checks()
    for region, total in want.items():
        checks.add(f"{region} total {total}", close(totals.get(region), total))
    checks.add("no other regions (archive excluded)", set(totals) == set(want))
    checks.add(f"grand_total {EXPECTED['grand_total']}", close(report.get("grand_total"), EXPECTED["grand_total"]))
    checks.add(f"skipped_rows {EXPECTED['skipped']}", report.get("skipped_rows") == EXPECTED["skipped"])
    return checks.verdict()
"""

_SOLVE = """
import csv, io, json, os
totals, skipped = {}, 0
for region in sorted(os.listdir("regions")):
    folder = os.path.join("regions", region)
    if region == "archive" or not os.path.isdir(folder):
        continue
    total = 0.0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".csv"):
            continue
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        delimiter = ";" if ";" in text.splitlines()[0] else ","
        for row in list(csv.reader(io.StringIO(text), delimiter=delimiter))[1:]:
            try:
                total += float(row[2].replace(",", ""))
            except (IndexError, ValueError):
                skipped += 1
    totals[region] = round(total, 2)
report = {"totals": totals, "grand_total": round(sum(totals.values()), 2), "skipped_rows": skipped}
with open("report.json", "w") as f:
    json.dump(report, f, indent=2)
print(json.dumps(report))
"""


def build(rng: random.Random) -> TaskDraft:
    regions = sorted(rng.sample(["north", "south", "east", "west", "central"], 3))
    months = sorted(rng.sample(range(1, 13), 2))
    semicolon = set(rng.sample([(r, m) for r in regions for m in months], 2))
    files: dict[str, str] = {}
    totals: dict[str, float] = {}
    skipped = 0
    for region in regions:
        cents = 0
        for month in months:
            delimiter = ";" if (region, month) in semicolon else ","
            rows: list[list[str]] = []
            for day in sorted(random_dates(rng, rng.randint(3, 6), span_days=28)):
                value = rng.randint(100, 500_000)
                cents += value
                text = f"{value / 100:.2f}"
                if delimiter == "," and value >= 100_000 and rng.random() < 0.6:
                    text = f"{value / 100:,.2f}"
                rows.append([f"2024-{month:02d}-{day.day:02d}", rng.choice(ITEMS), text])
            if rng.random() < 0.7:
                rows.insert(
                    rng.randrange(len(rows) + 1),
                    [f"2024-{month:02d}-15", rng.choice(ITEMS), rng.choice(["N/A", "", "tbd"])],
                )
                skipped += 1
            files[f"regions/{region}/2024-{month:02d}.csv"] = csv_text(
                ["date", "product", "amount"], rows, delimiter=delimiter
            )
        totals[region] = round(cents / 100, 2)
    files[f"regions/{rng.choice(regions)}/notes.md"] = "Figures are in EUR. Ask finance about Q3.\n"
    files["regions/archive/2023-12.csv"] = csv_text(
        ["date", "product", "amount"],
        [["2023-12-03", "widget", "99999.00"], ["2023-12-09", "gear", "12.50"]],
    )
    grand_total = round(sum(totals.values()), 2)
    prompt = (
        "Each folder under /workspace/regions (except regions/archive, which must be ignored) holds "
        "the monthly sales exports of one region (columns date, product, amount). Compute the "
        "total amount per region and overall. Rows without a usable amount must be skipped and "
        "counted. Write /workspace/report.json as "
        '{"totals": {"<region>": <total>, ...}, "grand_total": <total>, "skipped_rows": <count>} '
        "with totals rounded to 2 decimals."
    )
    solution = [list_dir("regions")]
    solution += [list_dir(f"regions/{region}") for region in regions]
    solution += [
        read(path) for path in sorted(files) if path.endswith(".csv") and "/archive/" not in path
    ]
    solution += [python_shell(_SOLVE), read("report.json")]
    report = {"totals": totals, "grand_total": grand_total, "skipped_rows": skipped}
    return TaskDraft(
        prompt=prompt,
        files=files,
        reference_solution=solution,
        reference_final="Report: " + json.dumps(report),
        verifier=python_verifier(
            _VERIFY, {"totals": totals, "grand_total": grand_total, "skipped": skipped}
        ),
    )


TEMPLATE = TaskTemplate(
    name="sales_rollup",
    version="1",
    difficulty=5,
    summary="per-region sales totals across mixed-delimiter exports with bad rows and an archive",
    build=build,
)

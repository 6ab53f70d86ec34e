"""Merge CSVs by date (difficulty 4): skip malformed files and list them; a decoy non-CSV file."""

from __future__ import annotations

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
def verify():
    rows = read_csv("merged.csv")
    if not rows:
        raise Reject("merged.csv is empty")
    body = rows[1:]
    want = EXPECTED["rows"]
    if not {tuple(r) for r in body} & {tuple(r) for r in want}:
        raise Reject("merged.csv has none of the expected rows")
    checks = Checks()
    checks.add("header is date,item,amount", rows[0] == ["date", "item", "amount"])
    checks.add("every row of the valid files is present", {tuple(r) for r in want} <= {tuple(r) for r in body})
    checks.add("no row from a malformed file or duplicated", len(body) == len(want))
    checks.add("rows sorted by date", [r[0] for r in body] == sorted(r[0] for r in body))
    checks.add("merged.csv is exactly the expected merge", body == want)
    skipped = read_lines("skipped.txt") if os.path.isfile("skipped.txt") else None
    checks.add("skipped.txt exists", skipped is not None)
    names = sorted(os.path.basename(s) for s in skipped or [])
    checks.add("skipped.txt lists exactly the malformed files", names == EXPECTED["malformed"])
    return checks.verdict()
"""

_SOLVE = """
import csv, glob, os, re
DATE = re.compile(r"^\\d{4}-\\d{2}-\\d{2}$")
rows, skipped = [], []
for path in sorted(glob.glob("data/*.csv")):
    with open(path, newline="", encoding="utf-8") as f:
        table = [r for r in csv.reader(f) if r]
    ok = bool(table) and table[0] == ["date", "item", "amount"]
    ok = ok and all(len(r) == 3 and DATE.match(r[0]) for r in table[1:])
    if ok:
        rows.extend(table[1:])
    else:
        skipped.append(os.path.basename(path))
rows.sort(key=lambda r: r[0])
with open("merged.csv", "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f, lineterminator="\\n")
    w.writerow(["date", "item", "amount"])
    w.writerows(rows)
with open("skipped.txt", "w", encoding="utf-8") as f:
    f.write("".join(s + "\\n" for s in skipped))
print(len(rows), "rows;", "skipped:", skipped)
"""

_BREAKAGES = ("header", "bad_date", "short_row")


def build(rng: random.Random) -> TaskDraft:
    n_files = rng.randint(4, 6)
    names = sorted(
        f"sales_{rng.choice(['north', 'south', 'east', 'west'])}_{i:02d}.csv"
        for i in range(n_files)
    )
    rows_per_file = [rng.randint(3, 6) for _ in names]
    dates = iter(random_dates(rng, sum(rows_per_file)))
    tables = {
        name: [
            [next(dates).isoformat(), rng.choice(ITEMS), str(rng.randint(1, 500))] for _ in range(k)
        ]
        for name, k in zip(names, rows_per_file, strict=True)
    }
    malformed = sorted(rng.sample(names, rng.randint(1, 2)))
    files: dict[str, str] = {}
    for name, table in tables.items():
        header = ["date", "item", "amount"]
        if name in malformed:
            breakage = rng.choice(_BREAKAGES)
            if breakage == "header":
                header = ["day", "product", "qty"]
            elif breakage == "bad_date":
                table = [list(r) for r in table]
                table[rng.randrange(len(table))][0] = rng.choice(
                    ["03/14/2024", "yesterday", "2024-13"]
                )
            else:
                table = [list(r) for r in table]
                table[rng.randrange(len(table))] = table[0][:2]
        files[f"data/{name}"] = csv_text(header, table)
    files["data/README.txt"] = "Exports from the regional systems. Not a CSV.\n"
    files["data/summary.csv.bak"] = csv_text(
        ["date", "item", "amount"], [["2023-12-31", "old", "1"]]
    )
    merged = sorted((r for n in names if n not in malformed for r in tables[n]), key=lambda r: r[0])
    prompt = (
        "Merge every .csv file in /workspace/data into /workspace/merged.csv: header "
        "date,item,amount, then all rows sorted by date (oldest first). A file is malformed when "
        "its header is not exactly date,item,amount or any row does not have 3 fields with a "
        "YYYY-MM-DD date; skip malformed files entirely and list their file names, one per line, "
        "in /workspace/skipped.txt."
    )
    solution = [list_dir("data")]
    solution += [read(f"data/{name}") for name in names]
    solution += [python_shell(_SOLVE), read("merged.csv"), read("skipped.txt")]
    return TaskDraft(
        prompt=prompt,
        files=files,
        reference_solution=solution,
        reference_final=f"Merged {len(merged)} rows; skipped {', '.join(malformed)}.",
        verifier=python_verifier(_VERIFY, {"rows": merged, "malformed": malformed}),
    )


TEMPLATE = TaskTemplate(
    name="merge_csv",
    version="1",
    difficulty=4,
    summary="merge CSVs sorted by date, skipping and reporting malformed files (decoy files)",
    build=build,
)

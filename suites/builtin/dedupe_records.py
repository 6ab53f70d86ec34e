"""Deduplicate records (difficulty 3): same e-mail up to case and spaces = duplicate; keep the first."""

from __future__ import annotations

import random

from suites.builtin.common import csv_text, person_names, python_shell, python_verifier, read
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    rows = read_csv("contacts_dedup.csv")
    if not rows:
        raise Reject("contacts_dedup.csv is empty")
    checks = Checks()
    checks.add("header is id,name,email", rows[0] == ["id", "name", "email"])
    body = rows[1:]
    checks.add(f"{len(EXPECTED['rows'])} records kept", len(body) == len(EXPECTED["rows"]))
    checks.add("first occurrences kept, unchanged, in order", body == EXPECTED["rows"])
    count = read_text("duplicates_removed.txt").strip() if os.path.isfile("duplicates_removed.txt") else None
    checks.add(f"duplicates_removed.txt says {EXPECTED['removed']}", count == str(EXPECTED["removed"]))
    return checks.verdict()
"""

_SOLVE = """
import csv
with open("contacts.csv", newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
header, body = rows[0], rows[1:]
seen, kept = set(), []
for row in body:
    key = row[2].strip().lower()
    if key not in seen:
        seen.add(key)
        kept.append(row)
with open("contacts_dedup.csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\\n")
    writer.writerow(header)
    writer.writerows(kept)
with open("duplicates_removed.txt", "w", encoding="utf-8") as f:
    f.write(f"{len(body) - len(kept)}\\n")
print(len(body) - len(kept))
"""


def _variant(rng: random.Random, email: str) -> str:
    kind = rng.choice(["upper", "spaces", "both", "same"])
    if kind == "upper":
        return email.upper()
    if kind == "spaces":
        return f" {email} "
    if kind == "both":
        return f"{email.capitalize()}  "
    return email


def build(rng: random.Random) -> TaskDraft:
    people = person_names(rng, rng.randint(6, 9))
    domain = rng.choice(["example.com", "example.org", "mail.test"])
    records = [[str(100 + i), name, f"{name.split()[0].lower()}.{name.split()[1].lower()}@{domain}"]
               for i, name in enumerate(people)]  # fmt: skip
    rows = [list(r) for r in records]
    removed = 0
    for _ in range(rng.randint(3, 5)):
        original = rng.choice(records)
        dup = [str(200 + removed), original[1], _variant(rng, original[2])]
        at = rng.randint(rows.index(original) + 1, len(rows))
        rows.insert(at, dup)
        removed += 1
    prompt = (
        "/workspace/contacts.csv (columns id,name,email) has duplicate records: two records are "
        "duplicates when their emails are equal ignoring upper/lower case and surrounding spaces. "
        "Write contacts_dedup.csv with the same header keeping only the first record of each "
        "e-mail, unchanged and in the original order, and write the number of records removed "
        "to duplicates_removed.txt."
    )
    return TaskDraft(
        prompt=prompt,
        files={"contacts.csv": csv_text(["id", "name", "email"], rows)},
        reference_solution=[read("contacts.csv"), python_shell(_SOLVE), read("contacts_dedup.csv")],
        reference_final=f"Removed {removed} duplicates.",
        verifier=python_verifier(_VERIFY, {"rows": records, "removed": removed}),
    )


TEMPLATE = TaskTemplate(
    name="dedupe_records",
    version="1",
    difficulty=3,
    summary="deduplicate CSV records by e-mail (case and whitespace variants), keep first",
    build=build,
)

"""CSV → JSON (difficulty 1): read a small CSV and write it as a JSON array of objects.

Two reference solutions (`either_reference`): write the JSON out by hand, or a Python
script that converts the file. Version 2 added the script; the tasks are version 1's.
"""

from __future__ import annotations

import json
import random

from suites.builtin.common import (
    CITIES,
    csv_text,
    either_reference,
    person_names,
    python_shell,
    python_verifier,
    read,
    write,
)
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    data = read_json(EXPECTED["output"])
    checks = Checks()
    if not checks.add("output is a JSON array", isinstance(data, list)):
        return checks.verdict()
    checks.add(f"has {len(EXPECTED['records'])} records", len(data) == len(EXPECTED["records"]))
    checks.add("ages are integers", all(
        isinstance(r, dict) and type(r.get("age")) is int for r in data
    ))
    checks.add("records match the CSV, in order", data == EXPECTED["records"])
    return checks.verdict()
"""

_CONVERT = """
import csv, json
with open("{source}") as f:
    rows = list(csv.DictReader(f))
for row in rows:
    row["age"] = int(row["age"])
with open("{output}", "w") as f:
    json.dump(rows, f, indent=2)
"""


def build(rng: random.Random) -> TaskDraft:
    stem = rng.choice(["people", "staff", "members", "customers", "guests"])
    n = rng.randint(3, 5)
    records = [
        {"name": name, "age": rng.randint(18, 80), "city": rng.choice(CITIES)}
        for name in person_names(rng, n)
    ]
    source = f"{stem}.csv"
    output = f"{stem}.json"
    rows = [[r["name"], r["age"], r["city"]] for r in records]
    prompt = (
        f"Convert {source} (in /workspace) to JSON: write {output} containing a JSON array with "
        f"one object per row, keys name, age and city, in the same order as the CSV. "
        f"age must be a JSON integer."
    )
    return TaskDraft(
        prompt=prompt,
        files={source: csv_text(["name", "age", "city"], rows)},
        reference_solution=either_reference(
            rng,
            transcribing=[read(source), write(output, json.dumps(records, indent=2) + "\n")],
            computing=[read(source), python_shell(_CONVERT.format(source=source, output=output))],
        ),
        reference_final=f"Wrote {len(records)} records to {output}.",
        verifier=python_verifier(_VERIFY, {"output": output, "records": records}),
    )


TEMPLATE = TaskTemplate(
    name="csv_to_json",
    version="2",
    difficulty=1,
    summary="convert a small CSV file to a JSON array of objects",
    build=build,
)

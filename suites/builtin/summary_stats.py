"""Summary statistics (difficulty 2): count/sum/mean/min/max of a CSV column into report.json."""

from __future__ import annotations

import json
import random

from suites.builtin.common import WORDS, csv_text, python_verifier, read, write
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    report = read_json(EXPECTED["output"])
    if not isinstance(report, dict):
        raise Reject(f"{EXPECTED['output']} must hold a JSON object")
    checks = Checks()
    for key, want in EXPECTED["stats"].items():
        got = report.get(key)
        ok = isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) <= 0.011
        checks.add(f"{key} = {want}", ok)
    return checks.verdict()
"""


def build(rng: random.Random) -> TaskDraft:
    column = rng.choice(["temperature", "latency_ms", "weight_kg", "voltage"])
    n = rng.randint(6, 12)
    sensors = [f"{rng.choice(WORDS)}-{i}" for i in range(n)]
    values = [round(rng.uniform(-20.0, 120.0), 1) for _ in range(n)]
    stats = {
        "count": n,
        "sum": round(sum(values), 2),
        "mean": round(sum(values) / n, 2),
        "min": min(values),
        "max": max(values),
    }
    source = "measurements.csv"
    prompt = (
        f"/workspace/{source} has columns sensor and {column}. Write report.json with a JSON "
        f"object holding the count, sum, mean, min and max of the {column} column "
        f'(keys "count", "sum", "mean", "min", "max"; numbers rounded to 2 decimals).'
    )
    return TaskDraft(
        prompt=prompt,
        files={
            source: csv_text(
                ["sensor", column], [[s, v] for s, v in zip(sensors, values, strict=True)]
            )
        },
        reference_solution=[read(source), write("report.json", json.dumps(stats, indent=2) + "\n")],
        reference_final=f"report.json: mean {column} is {stats['mean']}.",
        verifier=python_verifier(_VERIFY, {"output": "report.json", "stats": stats}),
    )


TEMPLATE = TaskTemplate(
    name="summary_stats",
    version="1",
    difficulty=2,
    summary="summary statistics of a CSV column into a JSON report",
    build=build,
)

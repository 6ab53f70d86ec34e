"""Extract fields from JSON lines (difficulty 3): users with a purchase, with decoys and a blank line."""

from __future__ import annotations

import json
import random

from suites.builtin.common import FIRST_NAMES, python_shell, python_verifier, read
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    lines = read_lines("purchasers.txt")
    checks = Checks()
    checks.add("no duplicate names", len(lines) == len(set(lines)))
    checks.add("names sorted alphabetically", lines == sorted(lines))
    checks.add("every purchaser listed", set(EXPECTED["users"]) <= set(lines))
    checks.add("no one else listed", set(lines) <= set(EXPECTED["users"]))
    if not set(lines) & set(EXPECTED["users"]):
        raise Reject("purchasers.txt names none of the purchasers")
    return checks.verdict()
"""

_SOLVE = """
import json
users = set()
with open("events.jsonl", encoding="utf-8") as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        event = json.loads(line)
        if event.get("type") == "purchase" and event.get("user"):
            users.add(event["user"])
with open("purchasers.txt", "w", encoding="utf-8") as out:
    out.write("".join(u + "\\n" for u in sorted(users)))
"""


def build(rng: random.Random) -> TaskDraft:
    users = [u.lower() for u in rng.sample(FIRST_NAMES, 7)]
    events: list[dict[str, object]] = []
    for i in range(rng.randint(14, 22)):
        kind = rng.choices(["view", "purchase", "purchase_refund", "login"], weights=[4, 3, 1, 2])[
            0
        ]
        event: dict[str, object] = {"id": i + 1, "type": kind, "user": rng.choice(users)}
        if kind.startswith("purchase"):
            event["amount"] = round(rng.uniform(3, 300), 2)
        events.append(event)
    # Traps: a purchase without a user (skip it), a refund-only user, a blank line.
    events.insert(rng.randrange(len(events)), {"id": 900, "type": "purchase", "amount": 1.0})
    refund_only = users[-1]
    events = [e for e in events if not (e.get("user") == refund_only and e["type"] == "purchase")]
    events.append({"id": 901, "type": "purchase_refund", "user": refund_only, "amount": 9.99})
    buyers = sorted({str(e["user"]) for e in events if e["type"] == "purchase" and "user" in e})
    if not buyers:
        events.append({"id": 902, "type": "purchase", "user": users[0], "amount": 5.0})
        buyers = [users[0]]
    lines = [json.dumps(e) for e in events]
    lines.insert(rng.randrange(1, len(lines)), "")
    prompt = (
        "/workspace/events.jsonl holds one JSON event per line. Write purchasers.txt listing "
        'every distinct "user" that has at least one event whose "type" is exactly "purchase", '
        "one name per line, sorted alphabetically."
    )
    return TaskDraft(
        prompt=prompt,
        files={"events.jsonl": "\n".join(lines) + "\n"},
        reference_solution=[read("events.jsonl"), python_shell(_SOLVE), read("purchasers.txt")],
        reference_final=f"{len(buyers)} purchasers.",
        verifier=python_verifier(_VERIFY, {"users": buyers}),
    )


TEMPLATE = TaskTemplate(
    name="jsonl_extract",
    version="1",
    difficulty=3,
    summary="extract distinct users with a purchase from JSON lines (decoy types, blank line)",
    build=build,
)

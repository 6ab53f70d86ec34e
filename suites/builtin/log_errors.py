"""Count and extract from logs (difficulty 2): ERROR-level lines, with a decoy in INFO messages."""

from __future__ import annotations

import random
from datetime import date, timedelta

from suites.builtin.common import BASE_DATE, WORDS, python_verifier, read, write
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
def verify():
    if not os.path.isfile("error_count.txt") and not os.path.isfile("errors.txt"):
        raise Reject("neither error_count.txt nor errors.txt exists")
    checks = Checks()
    count = read_text("error_count.txt").strip() if os.path.isfile("error_count.txt") else None
    checks.add(f"error_count.txt says {EXPECTED['count']}", count == str(EXPECTED["count"]))
    lines = None
    if os.path.isfile("errors.txt"):
        lines = [line.rstrip("\\r") for line in read_text("errors.txt").splitlines() if line.strip()]
    checks.add("errors.txt holds exactly the ERROR lines, in order", lines == EXPECTED["lines"])
    return checks.verdict()
"""

_COMPONENTS = ("api", "db", "cache", "auth", "worker", "scheduler")
_INFO = ("request served", "cache warmed", "job queued", "connection opened", "config reloaded")
_WARN = ("slow query", "retrying request", "disk 80% full", "deprecated flag used")
_ERROR = ("connection refused", "timeout talking to upstream", "null pointer in handler",
          "disk full", "permission denied on /var/data", "checksum mismatch")  # fmt: skip


def _stamp(day: date, seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{day.isoformat()} {hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def build(rng: random.Random) -> TaskDraft:
    day = BASE_DATE + timedelta(days=rng.randint(0, 300))
    lines: list[str] = []
    errors: list[str] = []
    clock = rng.randint(6, 10) * 3600  # seconds since midnight; stays within the day
    for _ in range(rng.randint(18, 30)):
        clock += rng.randint(1, 90)
        level = rng.choices(["INFO", "WARN", "ERROR"], weights=[6, 2, 2])[0]
        component = rng.choice(_COMPONENTS)
        message = rng.choice({"INFO": _INFO, "WARN": _WARN, "ERROR": _ERROR}[level])
        line = f"{_stamp(day, clock)} {level} {component}: {message}"
        lines.append(line)
        if level == "ERROR":
            errors.append(line)
    # The trap: INFO lines that mention ERROR in their message are not errors.
    for _ in range(2):
        at = rng.randrange(len(lines))
        stamp = lines[at][:19]
        decoy = f"{stamp} INFO {rng.choice(_COMPONENTS)}: previous ERROR from {rng.choice(WORDS)} was resolved"
        lines.insert(at + 1, decoy)
    if not errors:
        line = f"{_stamp(day, clock + 5)} ERROR db: {rng.choice(_ERROR)}"
        lines.append(line)
        errors.append(line)
    log = "\n".join(lines) + "\n"
    prompt = (
        "/workspace/logs/app.log has one entry per line: date, time, LEVEL, component: message. "
        "Count the entries whose level is ERROR and write the number to error_count.txt; "
        "copy those entries, unchanged and in order, to errors.txt (one per line)."
    )
    return TaskDraft(
        prompt=prompt,
        files={"logs/app.log": log},
        reference_solution=[
            read("logs/app.log"),
            write("error_count.txt", f"{len(errors)}\n"),
            write("errors.txt", "\n".join(errors) + "\n"),
        ],
        reference_final=f"{len(errors)} ERROR entries.",
        verifier=python_verifier(_VERIFY, {"count": len(errors), "lines": errors}),
    )


TEMPLATE = TaskTemplate(
    name="log_errors",
    version="1",
    difficulty=2,
    summary="count ERROR entries in a log and extract them (decoy: ERROR inside INFO messages)",
    build=build,
)

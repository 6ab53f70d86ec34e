"""Helpers shared by the built-in templates: word pools, CSV text, the verifier prelude.

Verifiers are self-contained stdlib Python scripts declared as `python3 -I -` and run
inside the jail through `Sandbox.run_python` (cwd `/workspace`; stdlib only, so a module
the agent planted cannot shadow it). The expected values are embedded in the script: the
agent never sees the verifier.
"""

from __future__ import annotations

import csv
import io
import json
import random
import textwrap
from datetime import date, timedelta
from typing import Any

from tasks.types import ReferenceCall, VerifierSpec

FIRST_NAMES = (
    "Ada", "Alan", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances",
    "Edsger", "Radia", "Donald", "Hedy", "John", "Katherine", "Tim", "Sophie", "Niklaus",
)  # fmt: skip
LAST_NAMES = (
    "Lovelace", "Turing", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton", "Ritchie",
    "Allen", "Dijkstra", "Perlman", "Knuth", "Lamarr", "Backus", "Johnson", "Wirth",
)  # fmt: skip
CITIES = (
    "Lisbon", "Oslo", "Kyoto", "Austin", "Nairobi", "Lima", "Hanoi", "Porto", "Tallinn",
    "Quito", "Perth", "Leeds", "Graz", "Osaka",
)  # fmt: skip
ITEMS = (
    "widget", "gadget", "sprocket", "gizmo", "bolt", "nut", "washer", "bracket", "hinge",
    "spring", "valve", "gear", "pulley", "lever",
)  # fmt: skip
WORDS = (
    "alpha", "bravo", "delta", "echo", "kilo", "lima", "nova", "orbit", "pixel", "quartz",
    "raven", "sierra", "tango", "umber", "vector", "zephyr",
)  # fmt: skip

BASE_DATE = date(2024, 1, 1)
"""Every generated date is an offset from this fixed day (never the wall clock)."""


def random_dates(rng: random.Random, k: int, *, span_days: int = 365) -> list[date]:
    """`k` distinct dates within `span_days` of `BASE_DATE`, in random order."""
    return [BASE_DATE + timedelta(days=d) for d in rng.sample(range(span_days), k)]


def person_names(rng: random.Random, k: int) -> list[str]:
    """`k` distinct "First Last" names."""
    pairs = [(f, last) for f in FIRST_NAMES for last in LAST_NAMES]
    return [f"{f} {last}" for f, last in rng.sample(pairs, k)]


def csv_text(header: list[str], rows: list[list[Any]], *, delimiter: str = ",") -> str:
    """CSV text with `\\n` line endings, the way most tools write it."""
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def shell(command: str) -> ReferenceCall:
    """An `execute_shell` reference call."""
    return ReferenceCall(tool="execute_shell", args={"command": command})


def python_shell(script: str) -> ReferenceCall:
    """An `execute_shell` call running a Python script via a quoted heredoc (no expansion)."""
    body = textwrap.dedent(script).strip("\n")
    return shell(f"python3 - <<'PYEOF'\n{body}\nPYEOF")


COMPUTING_SHARE = 0.5
"""Share of a two-way template's instances whose reference solution computes the answer."""


def either_reference(
    rng: random.Random, transcribing: list[ReferenceCall], computing: list[ReferenceCall]
) -> list[ReferenceCall]:
    """One of a task's two reference solutions, drawn from the task's own `rng`.

    Some templates can be solved two ways: by reading the data and writing out what was
    read (transcribing: the answer's names, numbers or rows are typed into a tool call),
    or by one command or script that computes the answer in the sandbox (computing).
    Their instances get one or the other (`COMPUTING_SHARE` computing), so the oracle's
    demonstrations show both, as data from several demonstrators would: a small model
    trained on them holds both ways, and the reward, not the demonstrations, says which
    one it carries out reliably (docs/training.md, "Two ways to solve a task"). Call it
    after every other draw of the template, so the task itself (prompt, files, verifier)
    is what it is for the seed without it.
    """
    return computing if rng.random() < COMPUTING_SHARE else transcribing


def read(path: str) -> ReferenceCall:
    """A `read_file` reference call."""
    return ReferenceCall(tool="read_file", args={"path": path})


def write(path: str, content: str) -> ReferenceCall:
    """A `write_file` reference call."""
    return ReferenceCall(tool="write_file", args={"path": path, "content": content})


def list_dir(path: str) -> ReferenceCall:
    """A `list_dir` reference call."""
    return ReferenceCall(tool="list_dir", args={"path": path})


_PRELUDE = '''\
import csv, hashlib, io, json, os, subprocess, sys


class Reject(Exception):
    """The output is missing or unusable: score 0 with this reason."""


def finish(score, reason):
    print(json.dumps({"score": round(float(score), 4), "reason": reason}))
    sys.exit(0)


# An output the agent made huge must cost it the task, not crash the verifier (out of
# memory, past its timeout: an infrastructure error, which would carry no reward at all).
MAX_READ_BYTES = 4 << 20


def read_text(path):
    if not os.path.isfile(path):
        raise Reject(f"{path} does not exist")
    with open(path, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise Reject(f"{path} is too large (over {MAX_READ_BYTES} bytes)")
    return data.decode("utf-8")  # as open(encoding="utf-8", newline="") reads it


def read_lines(path):
    return [line.strip() for line in read_text(path).splitlines() if line.strip()]


def read_json(path):
    text = read_text(path)
    try:
        return json.loads(text)
    except ValueError as e:
        raise Reject(f"{path} is not valid JSON: {e}") from None


def read_csv(path):
    return [row for row in csv.reader(io.StringIO(read_text(path))) if row]


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Checks:
    def __init__(self):
        self.results = []

    def add(self, name, ok):
        self.results.append((name, bool(ok)))
        return bool(ok)

    def verdict(self):
        failed = [name for name, ok in self.results if not ok]
        total = len(self.results)
        if not failed:
            return 1.0, f"all {total} checks passed"
        passed = total - len(failed)
        return passed / total, f"{passed}/{total} checks passed; failed: " + "; ".join(failed)


'''

_EPILOGUE = """

try:
    SCORE, REASON = verify()
except Reject as e:
    finish(0.0, str(e))
except (ValueError, KeyError, TypeError, IndexError, AttributeError, OSError, csv.Error) as e:
    finish(0.0, f"output is malformed: {type(e).__name__}: {e}")
finish(SCORE, REASON)
"""


def python_verifier(body: str, expected: Any, *, timeout_s: float = 20.0) -> VerifierSpec:
    """A verifier whose `body` defines `verify() -> (score, reason)` and may use `EXPECTED`.

    The body can raise `Reject(reason)` for a score of 0; the prelude's helpers
    (`read_text`, `read_lines`, `read_json`, `read_csv`, `sha256_of`, `Checks`) are in scope.
    """
    literal = json.dumps(json.dumps(expected, sort_keys=True))
    script = (
        _PRELUDE
        + f"EXPECTED = json.loads({literal})\n\n"
        + textwrap.dedent(body).strip("\n")
        + _EPILOGUE
    )
    return VerifierSpec(argv=["python3", "-I", "-"], stdin=script, timeout_s=timeout_s)

"""Repair a failing Python module (difficulty 4): make its tests pass; hidden edge cases checked too."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from suites.builtin.common import python_verifier, read, shell, write
from suites.template import TaskDraft, TaskTemplate


@dataclass(frozen=True)
class _Function:
    name: str
    buggy: str
    fixed: str
    visible: tuple[tuple[list[Any], Any], ...]
    """(args, expected) pairs the visible test file asserts (`test_lines` renders them) and
    the verifier checks itself; expected `"raises:ValueError"` means that exception."""
    hidden: tuple[tuple[list[Any], Any], ...]
    """(args, expected) pairs only the verifier knows, in the same form."""

    def test_lines(self) -> str:
        """Body lines of the unittest method asserting the visible cases; `m` is the module."""
        lines = []
        for args, want in self.visible:
            call = f"m.{self.name}({', '.join(repr(a) for a in args)})"
            if isinstance(want, str) and want.startswith("raises:"):
                lines += [f"with self.assertRaises({want.split(':', 1)[1]}):", f"    {call}"]
            else:
                lines.append(f"self.assertEqual({call}, {want!r})")
        return "\n".join(lines)


_FUNCTIONS = (
    _Function(
        name="mean",
        buggy='''def mean(values):
    """Arithmetic mean of a non-empty list; ValueError for an empty one."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / (len(values) - 1)
''',
        fixed='''def mean(values):
    """Arithmetic mean of a non-empty list; ValueError for an empty one."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)
''',
        visible=(([[2, 4, 6]], 4), ([[]], "raises:ValueError")),
        hidden=(([[5]], 5), ([[1, 2]], 1.5), ([[]], "raises:ValueError")),
    ),
    _Function(
        name="is_leap",
        buggy='''def is_leap(year):
    """True for Gregorian leap years."""
    return year % 4 == 0
''',
        fixed='''def is_leap(year):
    """True for Gregorian leap years."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
''',
        visible=(([2024], True), ([2023], False), ([1900], False)),
        hidden=(([2000], True), ([2100], False), ([1996], True), ([2023], False)),
    ),
    _Function(
        name="word_count",
        buggy='''def word_count(text):
    """Number of whitespace-separated words in text."""
    return len(text.split(" "))
''',
        fixed='''def word_count(text):
    """Number of whitespace-separated words in text."""
    return len(text.split())
''',
        visible=((["a b c"], 3), (["hello  world"], 2)),
        hidden=(([""], 0), (["  lead and trail "], 3), (["tabs\tand\nnewlines"], 3)),
    ),
    _Function(
        name="clamp",
        buggy='''def clamp(x, lo, hi):
    """x limited to the closed interval [lo, hi]."""
    return max(lo, min(x, lo))
''',
        fixed='''def clamp(x, lo, hi):
    """x limited to the closed interval [lo, hi]."""
    return max(lo, min(x, hi))
''',
        visible=(([5, 0, 10], 5), ([-1, 0, 10], 0)),
        hidden=(([99, 0, 10], 10), ([10, 0, 10], 10), ([-3, -5, 5], -3)),
    ),
    _Function(
        name="median",
        buggy='''def median(values):
    """Median of a non-empty list of numbers."""
    return values[len(values) // 2]
''',
        fixed='''def median(values):
    """Median of a non-empty list of numbers."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
''',
        visible=(([[3, 1, 2]], 2), ([[7]], 7)),
        hidden=(([[4, 1, 3, 2]], 2.5), ([[9, 8, 7, 1, 2]], 7), ([[1, 1]], 1)),
    ),
)

_VERIFY = """
# The agent's code runs in child interpreters started with -I and the workspace appended to
# sys.path (after the stdlib, so a planted unittest.py cannot fake a pass) and with a fresh
# pycache prefix (a stale __pycache__ must not decide the verdict).
CHILD_TIMEOUT_S = 10
TESTS = "import sys, unittest; sys.path.append('.'); unittest.main(module=None, argv=['unittest', sys.argv[1]])"
RUNNER = '''
import importlib, json, sys
sys.path.append(".")
module = importlib.import_module(sys.argv[1])
results = []
for func, args in json.loads(sys.stdin.read()):
    try:
        results.append(["ok", getattr(module, func)(*args)])
    except Exception as e:
        results.append(["raises", type(e).__name__])
print(json.dumps(results))
'''


def passed(got, want):
    if isinstance(want, str) and want.startswith("raises:"):
        return got == ["raises", want.split(":", 1)[1]]
    return isinstance(got, list) and len(got) == 2 and got[0] == "ok" and got[1] == want


def verify():
    import tempfile

    module = EXPECTED["module"]
    test_file = f"test_{module}.py"
    if not os.path.isfile(test_file) or sha256_of(test_file) != EXPECTED["test_sha"]:
        raise Reject(f"{test_file} was modified or removed")
    python = [sys.executable, "-I", "-X", "pycache_prefix=" + tempfile.mkdtemp()]

    # Both runs fit the verifier's own timeout: code that hangs them is the agent's failure,
    # never a verifier that timed out (an infrastructure error).
    def child(code, arg, stdin=None):
        try:
            return subprocess.run(
                [*python, "-c", code, arg], input=stdin, capture_output=True, text=True,
                timeout=CHILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise Reject(f"the tests in {test_file} did not finish within {CHILD_TIMEOUT_S} s")

    run = child(TESTS, f"test_{module}")
    visible, hidden = EXPECTED["visible"], EXPECTED["hidden"]
    cases = visible + hidden
    probe = child(RUNNER, module, json.dumps([[c["func"], c["args"]] for c in cases]))
    try:
        results = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        results = []
    if not isinstance(results, list):
        results = []
    got = [results[i] if i < len(results) else None for i in range(len(cases))]
    # The run's exit status alone is the agent's code's to forge (os._exit(0) on import, no-op
    # asserts): the visible tests pass only if their calls also return what they assert here.
    if run.returncode != 0 or not all(passed(g, c["expect"]) for c, g in zip(visible, got)):
        raise Reject(f"the tests in {test_file} still fail")
    checks = Checks()
    checks.add(f"{test_file} passes", True)
    for case, result in zip(hidden, got[len(visible):]):
        want = case["expect"]
        checks.add(f"{case['func']}{tuple(case['args'])} == {want!r}", passed(result, want))
    return checks.verdict()
"""


def _indent(text: str, prefix: str) -> str:
    return "".join(prefix + line + "\n" for line in text.splitlines())


def build(rng: random.Random) -> TaskDraft:
    module = rng.choice(["mathutils", "helpers", "toolbox", "numtools"])
    chosen = rng.sample(_FUNCTIONS, 3)
    broken = chosen[0]
    order = rng.sample(chosen, 3)
    header = '"""Small helpers used by the reporting scripts."""\n'
    buggy_src = header + "".join("\n\n" + (f.buggy if f is broken else f.fixed) for f in order)
    fixed_src = header + "".join("\n\n" + f.fixed for f in order)
    test_src = f"import unittest\n\nimport {module} as m\n\n\nclass Test{module.title()}(unittest.TestCase):\n"
    for f in order:
        test_src += f"    def test_{f.name}(self):\n" + _indent(f.test_lines(), " " * 8) + "\n"
    test_src += 'if __name__ == "__main__":\n    unittest.main()\n'
    visible = [
        {"func": f.name, "args": args, "expect": want} for f in order for args, want in f.visible
    ]
    hidden = [
        {"func": f.name, "args": args, "expect": want} for f in chosen for args, want in f.hidden
    ]
    test_file = f"test_{module}.py"
    run_tests = f"python3 -B -m unittest -v test_{module}"
    prompt = (
        f"The tests in /workspace/{test_file} fail. Fix the bug in /workspace/{module}.py so that "
        f"`{run_tests}` passes. Do not modify the test file; the functions must behave as their "
        "docstrings say for every input, not only the tested ones."
    )
    return TaskDraft(
        prompt=prompt,
        files={f"{module}.py": buggy_src, test_file: test_src},
        reference_solution=[
            read(f"{module}.py"),
            read(test_file),
            shell(run_tests),
            write(f"{module}.py", fixed_src),
            shell(run_tests),
        ],
        reference_final=f"Fixed {broken.name} in {module}.py; the tests pass.",
        verifier=python_verifier(
            _VERIFY,
            {
                "module": module,
                "test_sha": hashlib.sha256(test_src.encode()).hexdigest(),
                "visible": visible,
                "hidden": hidden,
            },
            timeout_s=25.0,
        ),
    )


TEMPLATE = TaskTemplate(
    name="fix_script",
    version="2",
    difficulty=4,
    summary="repair a buggy Python module until its unittest passes (hidden edge cases)",
    build=build,
)

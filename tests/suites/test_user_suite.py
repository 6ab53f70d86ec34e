"""User suites: the format, located errors for malformed `suite.yaml`, discovery, and a run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandbox.settings import SandboxSettings
from suites.check import replay_reference
from suites.errors import SuiteConflict, SuiteFormatError, SuiteNotFound
from suites.registry import EXAMPLES_DIR, available_suites, load_suite
from suites.settings import SuitesSettings
from suites.user_suite import VERIFIER_DIR, load_user_suite
from tasks.verify import run_verifier

VALID = """\
name: mini
version: 2
tasks:
  - name: hello
    difficulty: 1
    prompt: Write hi to out.txt
    files:
      seed.txt: inline text
      data/in.csv: {from: files/in.csv}
    reference_solution:
      - tool: write_file
        args: {path: out.txt, content: "hi\\n"}
    verifier:
      command: python3 -I /tmp/epiflow-verifier/check.py
      files: [check.py]
"""


def write_suite(folder: Path, text: str) -> Path:
    (folder / "files").mkdir(parents=True, exist_ok=True)
    (folder / "files" / "in.csv").write_text("a,b\n1,2\n")
    (folder / "check.py").write_text(
        "import json, os\n"
        "ok = os.path.isfile('out.txt') and open('out.txt').read().strip() == 'hi'\n"
        "print(json.dumps({'score': 1 if ok else 0, 'reason': 'ok' if ok else 'no hi'}))\n"
    )
    (folder / "suite.yaml").write_text(text)
    return folder


def format_error(tmp_path: Path, text: str) -> SuiteFormatError:
    with pytest.raises(SuiteFormatError) as info:
        load_user_suite(write_suite(tmp_path / "s", text), sandbox=SandboxSettings())
    return info.value


def test_valid_suite_loads(tmp_path):
    suite = load_user_suite(write_suite(tmp_path / "s", VALID), sandbox=SandboxSettings())
    assert (suite.name, suite.version, list(suite.templates)) == ("mini", "2", ["hello"])
    task = suite.generate("hello", 5)
    assert task.files == {"seed.txt": "inline text", "data/in.csv": "a,b\n1,2\n"}
    assert task.verifier.argv == ["/bin/sh", "-c", "python3 -I /tmp/epiflow-verifier/check.py"]
    assert list(task.verifier.files) == [f"{VERIFIER_DIR}/check.py"]
    assert suite.generate("hello", 5) == task


# (replace this, with that) → the field and the 1-based line the error must name.
MALFORMED = [
    ("difficulty: 1", "difficulty: 9", "tasks[0].difficulty", 5, "less than or equal to 5"),
    ("difficulty: 1", "difficulty: easy", "tasks[0].difficulty", 5, "integer"),
    ("    difficulty: 1\n", "", "tasks[0].difficulty", 4, "required field is missing"),
    ("name: hello", "name: Hello World", "tasks[0].name", 4, "lower-case"),
    ("prompt: Write hi to out.txt", "prompt: ''", "tasks[0].prompt", 6, "at least 1 character"),
    ("prompt: Write hi", "promt: Write hi", "tasks[0].promt", 6, "unknown field"),
    (
        "{from: files/in.csv}",
        "{frm: files/in.csv}",
        "tasks[0].files['data/in.csv']",
        9,
        "unknown key",
    ),
    (
        "{from: files/in.csv}",
        "{from: files/gone.csv}",
        "tasks[0].files['data/in.csv'].from",
        9,
        "does not exist",
    ),
    ("data/in.csv:", "../escape.csv:", "tasks[0].files['../escape.csv']", 9, "without `..`"),
    ("tool: write_file", "tool: rm_rf", "tasks[0].reference_solution[0].tool", 11, "execute_shell"),
    (
        'args: {path: out.txt, content: "hi\\n"}',
        "args: {path: out.txt}",
        "tasks[0].reference_solution[0]",
        11,
        "missing argument 'content'",
    ),
    (
        'args: {path: out.txt, content: "hi\\n"}',
        "args: {path: 3, content: x}",
        "tasks[0].reference_solution[0]",
        11,
        "must be a string",
    ),
    (
        "      files: [check.py]\n",
        "      files: [check.py]\n      argv: [python3]\n",
        "tasks[0].verifier",
        13,
        "exactly one of",
    ),
    ("files: [check.py]", "files: [nope.py]", "tasks[0].verifier.files[0]", 15, "does not exist"),
    ("files: [check.py]", "timeout_s: -1", "tasks[0].verifier.timeout_s", 15, "greater than 0"),
    ("name: mini", "name: builtin", "name", 1, "reserved"),
    ("version: 2\n", "", "version", 1, "required field is missing"),
]


@pytest.mark.parametrize(("old", "new", "field", "line", "message"), MALFORMED)
def test_malformed_field_is_named_with_file_and_line(tmp_path, old, new, field, line, message):
    assert old in VALID
    error = format_error(tmp_path, VALID.replace(old, new, 1))
    matching = [i for i in error.issues if i.field == field]
    assert matching, [str(i) for i in error.issues]
    issue = matching[0]
    assert issue.file == tmp_path / "s" / "suite.yaml"
    assert issue.line == line, str(issue)
    assert message in issue.message
    assert f"suite.yaml:{line}:" in str(error) and field in str(error)


def test_every_problem_is_reported_at_once(tmp_path):
    text = VALID.replace("difficulty: 1", "difficulty: 0").replace("prompt:", "promt:")
    error = format_error(tmp_path, text)
    assert {i.field for i in error.issues} >= {
        "tasks[0].difficulty",
        "tasks[0].promt",
        "tasks[0].prompt",
    }


def test_duplicate_task_names(tmp_path):
    second = VALID.split("tasks:\n", 1)[1]
    error = format_error(tmp_path, VALID + second)
    assert [(i.field, i.line) for i in error.issues] == [("tasks[1].name", 16)]
    assert "duplicate task name 'hello'" in error.issues[0].message


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("name: x\ntasks: [\n", "not valid YAML", 3),
        ("- just\n- a list\n", "expected a mapping", 1),
        ("", "an empty file", None),
        ("name: x\n\tversion: 1\n", "not valid YAML", 2),
    ],
)
def test_unparseable_file(tmp_path, text, message, line):
    error = format_error(tmp_path, text)
    assert len(error.issues) == 1
    assert message in error.issues[0].message
    assert error.issues[0].line == line


def test_example_suite_is_found_and_valid():
    names = [e.name for e in available_suites(SuitesSettings())]
    assert names[0] == "builtin" and "textops" in names
    suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
    assert suite.source == EXAMPLES_DIR / "textops"
    assert len(suite.templates) >= 3


def test_suites_path_from_environment(tmp_path, monkeypatch):
    write_suite(tmp_path / "many" / "a", VALID)
    write_suite(tmp_path / "single", VALID.replace("name: mini", "name: other"))
    monkeypatch.setenv("EPIFLOW_SUITES_PATH", f"{tmp_path / 'many'}:{tmp_path / 'single'}:")
    settings, sandbox = SuitesSettings(), SandboxSettings()
    assert load_suite("mini", settings=settings, sandbox=sandbox).source == tmp_path / "many" / "a"
    assert load_suite("other", settings=settings, sandbox=sandbox).name == "other"


def test_broken_suite_on_the_path_is_loadable_by_folder_name_for_its_error(tmp_path):
    write_suite(tmp_path / "broken", "name: [\n")
    settings = SuitesSettings(path=[tmp_path])
    with pytest.raises(SuiteFormatError, match="not valid YAML"):
        load_suite("broken", settings=settings, sandbox=SandboxSettings())
    assert load_suite("builtin", settings=settings, sandbox=SandboxSettings()).name == "builtin"


def test_name_conflicts_and_unknown_names(tmp_path):
    write_suite(tmp_path / "a", VALID)
    write_suite(tmp_path / "b", VALID)
    settings = SuitesSettings(path=[tmp_path], include_examples=False)
    with pytest.raises(SuiteConflict, match="'mini' is declared more than once"):
        load_suite("mini", settings=settings, sandbox=SandboxSettings())
    with pytest.raises(SuiteNotFound, match="no suite named 'zzz'"):
        load_suite("zzz", settings=settings, sandbox=SandboxSettings())


def test_example_suite_oracle_and_idle_on_nsjail(open_task_sandbox):
    suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())

    async def body():
        for task in suite.instances(1):
            async with await open_task_sandbox(task.files) as box:
                idle = await run_verifier(box, task)
            async with await open_task_sandbox(task.files) as box:
                await replay_reference(box, task)
                oracle = await run_verifier(box, task)
            assert (idle.score, idle.error) == (0.0, False), (task.template, idle)
            assert (oracle.score, oracle.error) == (1.0, False), (task.template, oracle)

    asyncio.run(body())


def test_written_suite_runs_on_nsjail(tmp_path, open_task_sandbox):
    suite = load_user_suite(write_suite(tmp_path / "s", VALID), sandbox=SandboxSettings())
    task = suite.generate("hello", 0)

    async def body():
        async with await open_task_sandbox(task.files) as box:
            before = await run_verifier(box, task)
            await replay_reference(box, task)
            after = await run_verifier(box, task)
        return before, after

    before, after = asyncio.run(body())
    assert (before.score, before.reason) == (0.0, "no hi")
    assert (after.score, after.reason) == (1.0, "ok")

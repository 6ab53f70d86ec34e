"""Generated user tasks: seeded params, templates, generator scripts in real nsjail.

The example suite's generated templates run with the oracle over ten seeds in real jails
(every instance distinct, deterministic, the idle policy at 0); generator scripts are
checked for isolation (they run in a jail, never in this process), failures and output
validation; malformed declarations are reported with file, line and field.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sandbox.settings import SandboxSettings
from suites.check import replay_reference
from suites.errors import GeneratorError, SuiteFormatError
from suites.generator import parse_generator_output
from suites.registry import load_suite
from suites.settings import SuitesSettings
from suites.suite import HELDOUT_SEED_BASE
from suites.user_suite import load_user_suite
from suites.user_template import PARAMS_FILE
from tasks.types import TaskInstance
from tasks.verify import run_verifier

GENERATED_EXAMPLES = ["numbers_above", "invoice_total"]


def digests(tasks: list[TaskInstance]) -> set[str]:
    return {t.content_digest for t in tasks}


async def oracle_and_idle(open_task_sandbox, task: TaskInstance) -> tuple[float, float]:
    async with await open_task_sandbox(task.files) as box:
        idle = await run_verifier(box, task)
    async with await open_task_sandbox(task.files) as box:
        results = await replay_reference(box, task)
        oracle = await run_verifier(box, task)
    assert all(r.ok for r in results), (task.task_id, results)
    assert not idle.error and not oracle.error, (task.task_id, idle, oracle)
    return oracle.score, idle.score


@pytest.mark.parametrize("template", GENERATED_EXAMPLES)
def test_example_generated_template_oracle_over_ten_seeds(template, open_task_sandbox):
    suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
    tasks = suite.instances(10, templates=[template])
    assert [t.seed for t in tasks] == list(range(10))
    assert len(digests(tasks)) == 10, "every seed must give a different task"
    # Deterministic: a fresh load (no cached drafts; the generator runs again) agrees.
    again = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
    assert [again.generate(template, t.seed) for t in tasks] == tasks

    async def body() -> list[tuple[float, float]]:
        return [await oracle_and_idle(open_task_sandbox, task) for task in tasks]

    scores = asyncio.run(body())
    assert scores == [(1.0, 0.0)] * 10


def test_heldout_instances_differ_from_training_instances():
    suite = load_suite("textops", settings=SuitesSettings(), sandbox=SandboxSettings())
    for template in GENERATED_EXAMPLES:
        train = suite.instances(10, templates=[template])
        heldout = suite.heldout_instances(3, templates=[template])
        assert all(t.seed >= HELDOUT_SEED_BASE for t in heldout)
        assert not digests(train) & digests(heldout)


PARAMS_SUITE = """\
name: gen
version: 1
tasks:
  - name: repeat
    difficulty: 2
    params:
      word: {choice: [apple, pear, plum, fig, kiwi, lime]}
      n: {int: [2, 40]}
      extra: {sample: [red, green, blue, cyan], k: [1, 3]}
    prompt: Write {{ word }} {{ n }} times to out/{{ word }}.txt ({{ extra | join(", ") }}).
    files:
      "in/{{ word }}.txt": "{{ n }}\\n"
      notes.txt: {from: notes.txt, render: true}
      raw.txt: {from: notes.txt}
    reference_solution:
      - tool: execute_shell
        args:
          command: "mkdir -p out && for i in $(seq {{ n }}); do echo {{ word | shell }}; done > out/{{ word }}.txt"
          timeout: "{{ n | add(10) }}"
      - tool: write_file
        args: {path: "{{ n }}", content: "{{ n }}"}
    reference_final: Wrote {{ n }} lines.
    verifier:
      argv: [python3, -I, /tmp/epiflow-verifier/check.py, "out/{{ word }}.txt"]
      files: [check.py]
"""

CHECK = """\
import json, sys
values = json.load(open("/tmp/epiflow-verifier/params.json"))
try:
    lines = open(sys.argv[1]).read().split()
except OSError:
    lines = []
ok = lines == [values["word"]] * values["n"]
print(json.dumps({"score": 1 if ok else 0, "reason": "ok" if ok else "wrong"}))
"""


def write_suite(folder: Path, text: str, extra: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "check.py").write_text(CHECK)
    (folder / "notes.txt").write_text("word={{ word }}\n")
    for rel, content in (extra or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    (folder / "suite.yaml").write_text(text)
    return folder


def test_params_render_into_every_field(tmp_path):
    suite = load_user_suite(write_suite(tmp_path / "s", PARAMS_SUITE), sandbox=SandboxSettings())
    task = suite.generate("repeat", 3)
    values = json.loads(task.verifier.files[PARAMS_FILE])
    word, n = values["word"], values["n"]
    assert task.prompt.startswith(f"Write {word} {n} times to out/{word}.txt (")
    assert task.files == {
        f"in/{word}.txt": f"{n}\n",
        "notes.txt": f"word={word}\n",
        "raw.txt": "word={{ word }}\n",
    }
    call = task.reference_solution[0]
    assert call.args["timeout"] == n + 10  # a whole expression keeps its type
    assert f"seq {n}" in call.args["command"]
    assert suite.generate("repeat", 3).reference_solution[1].args == {
        "path": str(n),
        "content": str(n),
    }
    assert task.reference_final == f"Wrote {n} lines."
    assert task.verifier.argv[-1] == f"out/{word}.txt"
    assert suite.generate("repeat", 3) == task
    assert len(digests(suite.instances(10))) == 10


def test_written_generated_suite_runs_on_nsjail(tmp_path, open_task_sandbox):
    suite = load_user_suite(write_suite(tmp_path / "s", PARAMS_SUITE), sandbox=SandboxSettings())

    async def body() -> list[tuple[float, float]]:
        return [await oracle_and_idle(open_task_sandbox, t) for t in suite.instances(3)]

    assert asyncio.run(body()) == [(1.0, 0.0)] * 3


# (replace this, with that) → the field and the 1-based line the error must name.
MALFORMED = [
    ("Write {{ word }}", "Write {{ wrod }}", "tasks[0].prompt", 10, "unknown parameter(s) wrod"),
    ("Write {{ word }}", "Write {{ word | shuffle }}", "tasks[0].prompt", 10, "unknown filter"),
    ("Write {{ word }}", "Write {{ word", "tasks[0].prompt", 10, "unclosed"),
    ("{int: [2, 40]}", "{int: [40, 2]}", "tasks[0].params.n", 8, "low <= high"),
    (
        "{sample: [red, green, blue, cyan], k: [1, 3]}",
        "{sample: [red]}",
        "tasks[0].params.extra",
        9,
        "needs `k`",
    ),
    ("      n: {int", "      N: {int", "tasks[0].params.N", 8, "must match"),
    (
        "{from: notes.txt}",
        "{from: notes.txt, render: maybe}",
        "tasks[0].files['raw.txt']",
        14,
        "render",
    ),
    ("files: [check.py]", "files: [params.json]", "tasks[0].verifier.files[0]", 25, "reserved"),
    (
        '"{{ n }}\\n"',
        '"{{ extra | upper }}"',
        "tasks[0].files['in/{{ word }}.txt']",
        12,
        "seed 0: `upper` in {{ extra | upper }}: needs a string, got a list",
    ),
    (
        '"in/{{ word }}.txt"',
        '"{{ \\"..\\" }}/{{ word }}.txt"',
        "tasks[0].files['{{ \"..\" }}/{{ word }}.txt']",
        12,
        "not inside /workspace",
    ),
    (
        'timeout: "{{ n | add(10) }}"',
        'timeout: "{{ word }}"',
        "tasks[0].reference_solution[0]",
        16,
        "must be an integer",
    ),
]


@pytest.mark.parametrize(("old", "new", "field", "line", "message"), MALFORMED)
def test_malformed_generated_task_is_located(tmp_path, old, new, field, line, message):
    assert old in PARAMS_SUITE
    folder = write_suite(tmp_path / "s", PARAMS_SUITE.replace(old, new, 1))
    (folder / "params.json").write_text("{}")
    with pytest.raises(SuiteFormatError) as info:
        load_user_suite(folder, sandbox=SandboxSettings())
    matching = [i for i in info.value.issues if i.field == field]
    assert matching, [str(i) for i in info.value.issues]
    assert matching[0].line == line, str(matching[0])
    assert message in matching[0].message
    assert f"suite.yaml:{line}:" in str(info.value)


def test_render_on_a_static_task_is_refused(tmp_path):
    static = PARAMS_SUITE.split("    params:")[0] + (
        "    prompt: Write hi\n"
        "    files:\n"
        "      notes.txt: {from: notes.txt, render: true}\n"
        "    verifier:\n"
        '      command: "true"\n'
    )
    with pytest.raises(SuiteFormatError) as info:
        load_user_suite(write_suite(tmp_path / "s", static), sandbox=SandboxSettings())
    assert [(i.field, i.line) for i in info.value.issues] == [
        ("tasks[0].files['notes.txt'].render", 8)
    ]


GENERATOR_SUITE = """\
name: gens
version: 1
tasks:
  - name: made
    difficulty: 3
    params:
      k: {int: [1, 1000]}
    generator:
      script: gen/make.py
      files: [gen/words.txt]
      provides: [word, where]
      timeout_s: 5
    prompt: "The word is in {{ where.file }} (k={{ k }})."
    verifier:
      command: python3 -I /tmp/epiflow-verifier/check.py out/x.txt
      files: [check.py]
"""

GOOD_GENERATOR = """\
import json, os, random, sys
request = json.loads(sys.stdin.readline())
rng = random.Random(request["seed"])
words = open("gen/words.txt").read().split()
word = rng.choice(words)
probe = {
    "cwd": os.getcwd(),
    "sees_host_dir": os.path.exists(HOST_DIR),
    "k": request["params"]["k"],
}
try:
    open(os.path.join(HOST_DIR, "escaped.txt"), "w").write("out")
    probe["wrote_host"] = True
except OSError:
    probe["wrote_host"] = False
print("debug lines before the JSON are fine")
print(json.dumps({"params": {"word": word, "where": {"file": f"{word}.txt", "probe": probe}},
                  "files": {f"{word}.txt": word + "\\n"}}))
"""


def generator_suite(tmp_path: Path, script: str, text: str = GENERATOR_SUITE) -> Path:
    return write_suite(
        tmp_path / "g",
        text,
        {
            "gen/make.py": script,
            "gen/words.txt": "alpha bravo charlie delta echo foxtrot golf hotel",
        },
    )


def test_generator_runs_in_a_jail_per_seed(tmp_path):
    host_dir = tmp_path / "host-only"
    host_dir.mkdir()
    folder = generator_suite(tmp_path, f"HOST_DIR = {str(host_dir)!r}\n" + GOOD_GENERATOR)
    suite = load_user_suite(folder, sandbox=SandboxSettings())
    tasks = suite.instances(6)
    for task in tasks:
        values = json.loads(task.verifier.files[PARAMS_FILE])
        word, probe = values["word"], values["where"]["probe"]
        assert probe == {
            "cwd": "/workspace",
            "sees_host_dir": False,
            "k": values["k"],
            "wrote_host": False,
        }
        assert task.files == {f"{word}.txt": word + "\n"}
        assert task.prompt == f"The word is in {word}.txt (k={values['k']})."
    assert not (host_dir / "escaped.txt").exists()
    assert len(digests(tasks)) == 6
    # Deterministic across fresh jails, and the same alone as in a batch.
    assert load_user_suite(folder, sandbox=SandboxSettings()).generate("made", 4) == tasks[4]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            "import sys\nprint('about to fail', file=sys.stderr)\nsys.exit(3)\n",
            "failed with exit code 3: about to fail",
        ),
        # The hang under test (its timeout is the behaviour checked), not a wait of the test.
        ("import time\ntime.sleep(30)\n", "timed out after 5s"),
        ('print(\'{"params": {"word": 1}}\')\n', "missing ['where']"),
        (
            'print(\'{"params": {"word": 1, "where": 2}, "files": {"../x": "a"}}\')\n',
            "file path '../x' must be relative",
        ),
        ("print('not json')\n", "the last stdout line is not JSON"),
    ],
)
def test_generator_failures_name_template_seed_and_stderr(tmp_path, script, message):
    suite = load_user_suite(generator_suite(tmp_path, script), sandbox=SandboxSettings())
    with pytest.raises(GeneratorError) as info:
        suite.generate("made", 7)
    error = info.value
    assert (error.template, error.seed) == ("made", 7)
    assert str(error).startswith("template 'made', seed 7: generator gen/make.py ")
    assert message in str(error)
    if "exit code" in message:
        assert error.exit_code == 3 and "about to fail" in error.stderr


def test_template_errors_on_generated_values_are_located(tmp_path):
    script = 'print(\'{"params": {"word": 1, "where": [1]}}\')\n'
    suite = load_user_suite(generator_suite(tmp_path, script), sandbox=SandboxSettings())
    with pytest.raises(SuiteFormatError) as info:
        suite.generate("made", 2)
    [issue] = info.value.issues
    assert (issue.field, issue.line) == ("tasks[0].prompt", 13)
    assert issue.message.startswith("seed 2: {{ where.file }}: no key 'file' in a list")


def test_generator_declaration_problems_are_located(tmp_path):
    text = GENERATOR_SUITE.replace("script: gen/make.py", "script: gen/gone.py").replace(
        "provides: [word, where]", "provides: [word, where, k]"
    )
    with pytest.raises(SuiteFormatError) as info:
        load_user_suite(generator_suite(tmp_path, GOOD_GENERATOR, text), sandbox=SandboxSettings())
    found = {(i.field, i.line): i.message for i in info.value.issues}
    assert "does not exist" in found[("tasks[0].generator.script", 9)]
    assert "also declared under `params`" in found[("tasks[0].generator.provides[2]", 11)]


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "nothing on stdout"),
        ('{"params": {"a": NaN}}', "NaN is not a JSON number"),
        ("[1]", "expected a JSON object"),
        ('{"params": {"a": 1}, "extra": 1}', "unknown key(s) ['extra']"),
        ('{"params": {"a": 1, "b": 2}}', "not declared ['b']"),
        ('{"params": {"a": "x\\u0000"}}', "NUL"),
        ('{"params": {"a": 1}, "files": {"/etc/x": "a"}}', "must be relative"),
        ('{"params": {"a": 1}, "files": {"x": 3}}', "must be text"),
    ],
)
def test_generator_output_is_validated(stdout, message):
    with pytest.raises(ValueError) as info:
        parse_generator_output(stdout, ["a"])
    assert message in str(info.value)


def test_generator_output_last_line_wins():
    parts = parse_generator_output(
        'noise\n{"params": {"a": [1, {"b": 2}]}, "files": {"d/x.txt": "hi"}}\n\n', ["a"]
    )
    assert parts.params == {"a": [1, {"b": 2}]} and parts.files == {"d/x.txt": "hi"}

"""Apply changes to a config file (difficulty 2): edit JSON settings, leave the example file alone."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

from suites.builtin.common import WORDS, python_verifier, read, write
from suites.template import TaskDraft, TaskTemplate

_VERIFY = """
MISSING = object()


def lookup(data, dotted):
    node = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return node


def verify():
    config = read_json("config/settings.json")
    applied = []
    for change in EXPECTED["changes"]:
        got = lookup(config, change["key"])
        ok = got is MISSING if change["op"] == "remove" else got == change["value"]
        applied.append((change["text"], ok))
    if not any(ok for _, ok in applied):
        raise Reject("none of the requested changes is in config/settings.json")
    checks = Checks()
    for text, ok in applied:
        checks.add(text, ok)
    checks.add("every other setting unchanged", config == EXPECTED["final"])
    example = EXPECTED["example_path"]
    checks.add(f"{example} untouched", os.path.isfile(example) and sha256_of(example) == EXPECTED["example_sha"])
    return checks.verdict()
"""


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _remove(data: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    del node[leaf]


def build(rng: random.Random) -> TaskDraft:
    app = rng.choice(WORDS)
    config: dict[str, Any] = {
        "app": {"name": app, "debug": False},
        "server": {"host": "0.0.0.0", "port": rng.choice([8000, 8080, 5000, 3000])},
        "database": {
            "url": f"postgresql://db.internal/{app}",
            "pool_size": rng.randint(2, 8),
            "timeout_s": rng.choice([5, 10, 30]),
        },
        "logging": {"level": "INFO", "file": f"/var/log/{app}.log"},
        "features": {"beta_ui": False, "metrics": True},
    }
    pool = [
        ("set", "server.port", rng.randint(9000, 9999)),
        ("set", "logging.level", rng.choice(["DEBUG", "WARNING"])),
        ("set", "database.pool_size", rng.randint(10, 40)),
        ("set", "features.beta_ui", True),
        ("add", f"features.{rng.choice(['dark_mode', 'search_v2', 'exports'])}", True),
        ("remove", "database.timeout_s", None),
        ("set", "app.debug", True),
    ]
    changes_raw = rng.sample(pool, rng.randint(3, 4))
    final = copy.deepcopy(config)
    changes: list[dict[str, Any]] = []
    for op, key, value in changes_raw:
        if op == "remove":
            _remove(final, key)
            text = f"remove {key}"
        else:
            _set(final, key, value)
            verb = "add" if op == "add" else "set"
            text = f"{verb} {key} to {json.dumps(value)}"
        changes.append({"op": op, "key": key, "value": value, "text": text})
    original = json.dumps(config, indent=2) + "\n"
    example_path = "config/settings.example.json"
    prompt = (
        "Apply these changes to /workspace/config/settings.json (dotted keys name nested "
        "objects; keep it valid JSON and leave every other setting unchanged):\n"
        + "\n".join(f"- {c['text']}" for c in changes)
    )
    return TaskDraft(
        prompt=prompt,
        files={"config/settings.json": original, example_path: original},
        reference_solution=[
            read("config/settings.json"),
            write("config/settings.json", json.dumps(final, indent=2) + "\n"),
        ],
        reference_final=f"Applied {len(changes)} changes.",
        verifier=python_verifier(
            _VERIFY,
            {
                "changes": changes,
                "final": final,
                "example_path": example_path,
                "example_sha": hashlib.sha256(original.encode()).hexdigest(),
            },
        ),
    )


TEMPLATE = TaskTemplate(
    name="config_update",
    version="1",
    difficulty=2,
    summary="apply listed changes to a nested JSON config without touching anything else",
    build=build,
)

"""A Harbor verifier's reward files → one episode score, by a declared rule. Pure logic.

`tests/test.sh` writes `/logs/verifier/reward.txt` (one number) or `reward.json` (an object
of named numbers: `{"reward": 1}`, or Harbor cookbook's multi-reward form
`{"correctness": 1, "performance": 0.5}`). Every key is kept (stored per episode); the
score is, in this order:

1. `reward.txt`'s number;
2. `reward.json`'s `reward` key, else its `score` key;
3. otherwise the suite's **reward rule** over every numeric key (`booleans` and non-numbers
   are stored but not combined): `mean` (the default), `min`, `max`, `product`, or
   `key:NAME` (that key alone; missing is an error). One numeric key is that key under
   every rule.

The rule is set per suite (`EPIFLOW_SUITES_HARBOR_REWARD_RULE`, and per dataset in
`EPIFLOW_SUITES_HARBOR_REWARD_RULES`: `suites/settings.py`). A reward file that is not a
number / an object of numbers, or a rule that finds nothing to combine, is a `ValueError`
(the verifier makes it an infrastructure error); the caller checks the range [0, 1].
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

RULES = ("mean", "min", "max", "product")
"""Rules that combine every numeric key; `key:NAME` picks one."""
DEFAULT_RULE = "mean"
_KEY_RULE = re.compile(r"^key:(\S+)$")


def check_rule(rule: str) -> str:
    """`rule` when it is one of `RULES` or `key:NAME`.

    Raises:
        ValueError: anything else (the message lists the valid rules).
    """
    if rule in RULES or _KEY_RULE.match(rule):
        return rule
    raise ValueError(f"must be one of {', '.join(RULES)} or key:NAME, got {rule!r}")


def combine(numbers: dict[str, float], rule: str) -> float:
    """The score of named rewards under `rule`.

    Raises:
        ValueError: no numbers, or `key:NAME` names a key that is not there.
    """
    if not numbers:
        raise ValueError("reward.json holds no numeric reward")
    picked = _KEY_RULE.match(rule)
    if picked:
        name = picked.group(1)
        if name not in numbers:
            raise ValueError(
                f"reward rule {rule!r}: reward.json has no numeric {name!r} (has {sorted(numbers)})"
            )
        return numbers[name]
    values = list(numbers.values())
    if rule == "min":
        return min(values)
    if rule == "max":
        return max(values)
    if rule == "product":
        return math.prod(values)
    return math.fsum(values) / len(values)


def reward_from(
    collected: dict[str, str], rule: str = DEFAULT_RULE
) -> tuple[float | None, dict[str, Any], str]:
    """(score or None when no reward file was written, every reward key, how it was derived).

    `collected` holds the texts of `reward_txt` and `reward_json` (either may be missing).
    The third item is `reward.txt`, `reward.json` (its `reward`/`score` key or its only
    number) or `reward.json (<rule> of a, b)`.

    Raises:
        ValueError: a reward file that is not a number / an object of numbers.
    """
    if "reward_txt" in collected:
        text = collected["reward_txt"].strip()
        try:
            value = float(text)
        except ValueError as e:
            raise ValueError(f"reward.txt is not a number: {text[:80]!r}") from e
        keys: dict[str, Any] = {"reward": value}
        if "reward_json" in collected:
            keys.update(_reward_json(collected["reward_json"]))
        return value, keys, "reward.txt"
    if "reward_json" not in collected:
        return None, {}, ""
    keys = _reward_json(collected["reward_json"])
    numbers = {
        k: float(v)
        for k, v in keys.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    for key in ("reward", "score"):
        if key in numbers:
            return numbers[key], keys, "reward.json"
    if len(numbers) == 1:
        return next(iter(numbers.values())), keys, "reward.json"
    try:
        score = combine(numbers, rule)
    except ValueError as e:
        raise ValueError(f"{e} (reward.json keys: {sorted(keys)})") from e
    return score, keys, f"reward.json ({rule} of {', '.join(sorted(numbers))})"[:200]


def _reward_json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"reward.json is not JSON: {text[:80]!r}") from e
    if not isinstance(data, dict):
        raise ValueError(f"reward.json must be an object, got {type(data).__name__}")
    return data

"""A reference solution's failure on a substituted base is the environment's, not an agent's.

A Harbor task's reference solution (`solution/solve.sh`, replayed by `scripted:oracle`) is a
fixed script written for the image its Dockerfile names. Where epiflow builds a substitute
(another distribution, Debian codename or Python version than the tag names:
`suites/harbor/bases.py` decides, `TaskEnvironment.base_substitution` carries it), the
script may fail on a difference it was never written for: Terminal-Bench 2.0's
`openssl-selfsigned-cert` parses bookworm's OpenSSL 3.0 `CN = x`, and its
`python:3.13-slim-bookworm` is built here as trixie, whose OpenSSL 3.5 prints `CN=x`.

So such an episode that the verifier would score `failed` is stored as `env_error` with a
reason that starts with `substituted-base: ` and names the substitution: an infrastructure
outcome (no reward, out of success rates and training, redone by a re-run), never the
agent's `failed`. Any other policy on a substituted base is scored as usual (an agent sees
the image it gets and can adapt), and so is the oracle on a base built as named.
"""

from __future__ import annotations

from agent.policies.base import Policy
from tasks.types import TaskInstance

SUBSTITUTED_BASE = "substituted-base"
"""The reason category of such an `env_error` (the first word of its `failure_reason`)."""


def substituted_base_failure(
    task: TaskInstance, policy: Policy, verifier_reason: str | None
) -> str | None:
    """The `env_error` reason when `policy` replays `task`'s reference solution on a
    substituted base and failed; None when the failure is scored as usual."""
    environment = task.environment
    if not policy.replays_reference or environment is None:
        return None
    if environment.base_substitution is None:
        return None
    return (
        f"{SUBSTITUTED_BASE}: the reference solution failed ({verifier_reason or 'no reason'}) "
        f"on {environment.base_substitution}: it is written for the image its Dockerfile "
        "names, so its failure on a substitute says nothing about an agent"
    )

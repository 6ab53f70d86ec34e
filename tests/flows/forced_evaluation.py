"""A checkpoint's held-out evaluation run, played beforehand by a scripted policy.

The tiny local model solves nothing in a few training steps, so a test that needs a
challenger which *clearly* beats its champion stores that checkpoint's evaluation run
(`eval-<checkpoint>`, the run key the `evaluate` flow uses) first, through the same
evaluation path (`collection.evaluation.run_evaluation`, real nsjail), with a scripted
policy standing in for a model that learned the tasks (`scripted:oracle`) or one that
never acts (`scripted:idle`). The `evaluate` flow then resumes that run: every planned
episode is stored, so they are read back (the checkpoint is still fetched and opened as
its `hf:` policy), and the promotion rule decides on them like on any other.
"""

from __future__ import annotations

import asyncio
import uuid

from agent.settings import PolicySettings

STAND_IN_MAX_STEPS = 12
"""Turns a stand-in may take: the oracle's whole plan on the built-in templates."""


def forced_evaluation(
    checkpoint_id: uuid.UUID, policy: str, *, instances: int, templates: list[str]
) -> int:
    """Store checkpoint `checkpoint_id`'s held-out evaluation run (`instances` per
    template of `templates`) as `policy` plays it; returns the episodes stored."""
    from agent.policies import make_policy
    from collection.evaluation import evaluation_settings, run_evaluation
    from config.settings import load_settings
    from suites.builtin import builtin_suite

    tasks = builtin_suite().heldout_instances(instances, templates=templates)
    settings = evaluation_settings(load_settings(), max_steps=STAND_IN_MAX_STEPS)
    episodes = asyncio.run(
        run_evaluation(
            make_policy(policy, settings=PolicySettings()),
            tasks,
            run_key=f"eval-{checkpoint_id}",
            suite="builtin",
            settings=settings,
        )
    )
    return len(episodes)

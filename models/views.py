"""What every column of every view means, from the docstrings the tables use.

A view column that passes a table column through is documented by that column's
docstring (`Episode.suite` → `episode_summary.suite`); a computed one has its own line
here. The migrations write these as `COMMENT ON COLUMN` on PostgreSQL, so `\\d+
episode_summary` in psql explains the view as `\\d+ episode` explains the table; the
test `tests/storage/test_view_plans.py` checks every view column has one.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlmodel import SQLModel

from models.checkpoint import Checkpoint
from models.collection_run import CollectionRun
from models.dataset import Dataset
from models.dataset_episode import DatasetEpisode
from models.episode import Episode
from models.episode_link import AtifDocument
from models.model_alias import ModelAliasChange
from models.qc_result import QcResult
from models.qc_run import QcRun
from models.step import Step

Source = tuple[type[SQLModel], str] | str
"""A table column whose docstring the view column shares, or the view column's own text."""

_COUNTS: dict[str, Source] = {
    "episodes": "Episodes counted in the group.",
    "keep": "Episodes of the group the gate kept.",
    "downweight": "Episodes of the group the gate downweighted.",
    "discard": "Episodes of the group the gate discarded.",
    "mean_quality": "Mean quality score of the group's verdicts, in [0, 1].",
    "min_quality": "Lowest quality score of the group's verdicts.",
    "max_quality": "Highest quality score of the group's verdicts.",
}

_EPISODE_COLUMNS = [
    "run_id",
    "suite",
    "template",
    "task_id",
    "rollout_index",
    "policy_id",
    "status",
    "failure_category",
    "claimed_success",
    "verifier_score",
    "final_reward",
    "total_reward",
    "n_steps",
    "n_parse_errors",
    "n_tool_errors",
    "n_injected_faults",
    "duration_ms",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "ended_at",
]

VIEW_COLUMNS: dict[str, dict[str, Source]] = {
    "episode_summary": {
        "episode_id": (Episode, "id"),
        "run_key": (CollectionRun, "run_key"),
        **{c: (Episode, c) for c in _EPISODE_COLUMNS},
        "qc_run_id": "Gate run of the episode's latest verdict (latest qc_result.created_at); "
        "NULL when never gated.",
        "qc_verdict": "Latest verdict: keep, downweight or discard; NULL when never gated.",
        "quality_score": "Quality score of the latest verdict, in [0, 1]; NULL when never gated.",
        "cost_usd": (Episode, "cost_usd"),
        "agent_name": (Episode, "agent_name"),
    },
    "tool_failure_rates": {
        "suite": (Episode, "suite"),
        "tool": (Step, "tool"),
        "fault_kind": "Kind of fault the sandbox injected into the calls; `none` for ordinary calls.",
        "calls": "Parsed tool calls in the group.",
        "failures": "Calls that failed: timed out, a typed error, killed by a signal or a "
        "non-zero exit.",
        "failure_rate": "failures / calls.",
    },
    "quality_by_suite": {
        "suite": (Episode, "suite"),
        "qc_run_id": (QcResult, "qc_run_id"),
        **_COUNTS,
    },
    "quality_by_template": {
        "qc_run_id": (QcResult, "qc_run_id"),
        "run_id": (QcRun, "run_id"),
        "suite": (Episode, "suite"),
        "template": (Episode, "template"),
        **{k: v for k, v in _COUNTS.items() if k != "max_quality"},
        "max_quality": _COUNTS["max_quality"],
    },
    "training_lineage": {
        "checkpoint_id": "A checkpoint that learned from the episode (trained on the snapshot, "
        "or fine-tuned from one that was); NULL when none did yet.",
        "checkpoint_created_at": (Checkpoint, "created_at"),
        "training_run_id": "The training run that made checkpoint_id; without a checkpoint, "
        "the run on the snapshot (NULL when nobody trained on it).",
        "algo": "Algorithm of that training run: sft, dpo, kto or grpo.",
        "training_status": "Status of that training run: running, completed or failed.",
        "dataset_id": (Dataset, "id"),
        "dataset_kind": (Dataset, "kind"),
        "qc_run_id": (Dataset, "qc_run_id"),
        "episode_id": (DatasetEpisode, "episode_id"),
        "role": (DatasetEpisode, "role"),
        "weight": (DatasetEpisode, "weight"),
        "run_id": (Episode, "run_id"),
        "suite": (Episode, "suite"),
        "template": (Episode, "template"),
        "task_id": (Episode, "task_id"),
        "generations": "Fine-tunes between the checkpoint trained on the snapshot (0) and "
        "checkpoint_id.",
        "trained_checkpoint_id": "The generation-0 checkpoint: the one trained on the snapshot.",
    },
    "reproducibility_by_suite": {
        "suite": (Episode, "suite"),
        "replays": "Replays of the suite's episodes (an episode replayed twice counts twice).",
        "identical_episodes": "Replays whose every step gave the same observation.",
        "reproducibility_rate": "identical_episodes / replays.",
        "step_reproducibility": "Identical steps over all replayed steps.",
    },
    "model_history": {
        "alias": (ModelAliasChange, "alias"),
        "seq": (ModelAliasChange, "seq"),
        "action": (ModelAliasChange, "action"),
        "checkpoint_id": (ModelAliasChange, "checkpoint_id"),
        "policy_spec": (ModelAliasChange, "policy_spec"),
        "previous_checkpoint_id": (ModelAliasChange, "previous_checkpoint_id"),
        "valid_from": "When the alias started pointing here (the change's `changed_at`, UTC).",
        "valid_to": "When the next change of the alias replaced it; NULL while it is current.",
        "is_current": "Whether this is the alias's current target (its latest change).",
        "reason": (ModelAliasChange, "reason"),
        "evidence": (ModelAliasChange, "evidence"),
        "actor": (ModelAliasChange, "actor"),
    },
    "episode_tree": {
        "root_episode_id": "The tree's root: an imported ATIF episode no other episode links to "
        "(a trajectory that is neither a sub-agent nor a continuation of another).",
        "episode_id": "The episode at this node of the tree.",
        "parent_episode_id": "The episode that links to this one; NULL for the root.",
        "link_kind": "How the parent links to it: `subagent` or `continuation`; `root` for "
        "the root.",
        "depth": "Links from the root (0 for the root).",
        "path": "The links from the root, e.g. `root/continuation.0/subagent.1` (kind.ordinal "
        "of each link); a node's descendants are the rows whose path starts with its path "
        "and `/`.",
        "session_id": (AtifDocument, "session_id"),
        "root_session_id": "The root's ATIF `session_id`: filter on it to get a session's tree.",
        "agent_name": (Episode, "agent_name"),
        "n_steps": "Agent steps of the episode (copied ones included).",
        "copied_steps": "Its agent steps marked `is_copied_context`: copied from an earlier "
        "trajectory, left out of the tokens and cost here.",
        "prompt_tokens": "Prompt tokens of its own steps (copied context left out); NULL when "
        "none reported them.",
        "completion_tokens": "Completion tokens of its own steps (copied context left out); "
        "NULL when none reported them.",
        "cost_usd": "Cost in USD of its own steps (copied context left out); NULL when none "
        "reported one.",
        "subtree_prompt_tokens": "prompt_tokens of the episode and every episode below it "
        "(sub-agents and continuations, at any depth).",
        "subtree_completion_tokens": "completion_tokens of the episode and every episode below it.",
        "subtree_cost_usd": "cost_usd of the episode and every episode below it: the root's is "
        "the whole tree's cost, sub-agents included.",
    },
}
"""view → column → where its comment comes from, in the view's column order."""


def view_comments(views: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
    """view → column → comment text, of `views` (default: every view). A migration names
    the views it wrote (a later migration's view does not exist yet when it runs)."""
    wanted = set(VIEW_COLUMNS if views is None else views)
    return {
        view: {
            column: source
            if isinstance(source, str)
            else str(source[0].model_fields[source[1]].description)
            for column, source in columns.items()
        }
        for view, columns in VIEW_COLUMNS.items()
        if view in wanted
    }

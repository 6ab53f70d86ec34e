"""Rows of each dataset kind from scored episodes. Pure: no SQL, no object store.

Every builder takes `SourceEpisode`s (the trajectory plus its QC verdict and quality
score) and returns `BuiltRows`: the parquet rows and the lineage entries (which episode,
in which role, with which weight). Columns per kind, in TRL's dataset formats:

- `sft`: `messages` (the chat, assistant turns trained), `weight` (quality score), `tools`
  (the episode's tools as OpenAI function schemas, a JSON string)
- `dpo`: `prompt` (shared history), `chosen` / `rejected` (one assistant turn each)
- `kto`: `prompt`, `completion` (one assistant turn), `label` (verifier-confirmed episode)
- `grpo`: `prompt` (system + task) and the task's coordinates to regenerate it
- `distill`: like `sft`, one verified trajectory per task chosen among teachers
- `cpt`: `text` (plain-text episode, failures and observations included)

Chats carry the system prompt in the requested `prompt_style` (`agent.prompt`): the
style the model will be trained and deployed with, whatever style the episode was
collected under.

Chats that are trained whole (`sft`, `distill`) never contain an assistant turn that did
not parse: TRL's assistant-only loss trains every assistant turn of a chat, so such a chat
is cut before its first unparsed turn (what the model did after it is left out), and an
episode with no parsed turn before it gives no row. `BuiltRows.manifest` counts what was
cut; the snapshot keeps the counts (`dataset.manifest`).

Steps marked `is_copied_context` (ATIF v1.5: copied from an earlier trajectory after
context summarisation, and trained on there) are never a training target: a whole chat is
cut before its first copied turn (`copied_context_turns_cut`), a KTO row never has one as
its completion (`copied_context_turns_left_out`; copied turns stay in the prompts of later
turns), a DPO pair never diverges at one (`copied_context_pairs_left_out`), and CPT text
leaves them out (`copied_context_steps_left_out`). GRPO rows hold the task prompt only.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.prompt import PromptStyle
from agent.trajectory import (
    INFRASTRUCTURE_STATUSES,
    OUTCOMELESS_STATUSES,
    EpisodeStatus,
    ParseKind,
    Trajectory,
)
from training.conversations import (
    Message,
    episode_messages,
    plain_text,
    prompt_messages,
    tools_for,
)

__all__ = [
    "BuiltRows",
    "DatasetKind",
    "LineageEntry",
    "SourceEpisode",
    "build_rows",
]


class DatasetKind(StrEnum):
    """What a snapshot is for."""

    SFT = "sft"
    DPO = "dpo"
    KTO = "kto"
    GRPO = "grpo"
    DISTILL = "distill"
    CPT = "cpt"


class SourceEpisode(BaseModel):
    """One episode with its quality-gate outcome, as the builders see it."""

    model_config = ConfigDict(frozen=True)

    trajectory: Trajectory
    """The full trajectory (from the object store)."""
    verdict: str | None = None
    """QC verdict: keep, downweight or discard; None when no gate run was used."""
    quality_score: float | None = None
    """QC quality score in [0, 1]; None when no gate run was used."""

    @property
    def episode_id(self) -> uuid.UUID:
        return self.trajectory.episode_id

    @property
    def succeeded(self) -> bool:
        """True when the verifier confirmed the outcome (the loop's `success` status)."""
        return self.trajectory.status == EpisodeStatus.SUCCESS

    @property
    def weight(self) -> float:
        """Sampling weight: the quality score, 1.0 when the episode was not gated."""
        return 1.0 if self.quality_score is None else float(self.quality_score)


class LineageEntry(BaseModel):
    """One `dataset_episode` row to be: an episode's role and weight in the snapshot."""

    model_config = ConfigDict(frozen=True)

    episode_id: uuid.UUID
    """Episode used."""
    role: str
    """example, chosen, rejected, desirable, undesirable or prompt."""
    weight: float
    """Total weight the episode carries in that role."""


class BuiltRows(BaseModel):
    """What a builder produced."""

    rows: list[dict[str, Any]] = Field(default_factory=list)
    """Parquet rows, one dict per example."""
    lineage: list[LineageEntry] = Field(default_factory=list)
    """Per (episode, role) lineage, weights summed over the rows that use it."""
    manifest: dict[str, int] = Field(default_factory=dict)
    """What the builder left out and why, counted (e.g. `unparsed_turns_cut`); empty
    when nothing was."""

    @property
    def weight_sum(self) -> float:
        return float(sum(float(r.get("weight", 1.0)) for r in self.rows))


class _Lineage:
    def __init__(self) -> None:
        self._weights: dict[tuple[uuid.UUID, str], float] = defaultdict(float)

    def add(self, episode_id: uuid.UUID, role: str, weight: float) -> None:
        self._weights[(episode_id, role)] += weight

    def entries(self) -> list[LineageEntry]:
        return [
            LineageEntry(episode_id=e, role=r, weight=w)
            for (e, r), w in sorted(self._weights.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
        ]


def _task_coordinates(traj: Trajectory) -> dict[str, Any]:
    return {
        "task_id": traj.task_id,
        "suite": traj.suite,
        "template": traj.template,
        "instance_seed": traj.instance_seed,
    }


def _has_assistant_turn(messages: Sequence[Message]) -> bool:
    return any(m["role"] == "assistant" for m in messages)


def _parsed(kind: ParseKind) -> bool:
    return kind in (ParseKind.TOOL_CALL, ParseKind.FINAL)


class _Manifest:
    """Counts of what the whole-chat builders cut (`BuiltRows.manifest`)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)

    def trained_chat(self, traj: Trajectory, messages: list[Message]) -> list[Message]:
        """`messages` cut before the first assistant turn whose step did not parse or is
        copied context (`Step.is_copied_context`: trained on in the trajectory it was
        copied from; a whole-chat row trains every assistant turn it holds, so it cannot
        hold one).

        `episode_messages` has one assistant turn per step, in order, so the n-th
        assistant message is step n. An unparsed turn is counted as `unparsed_turns_cut`
        and the turns after it as `turns_after_unparsed_cut`; a cut at copied context
        counts the copied turns left out as `copied_context_turns_cut` and the others as
        `turns_after_copied_context_cut`; the episode counts in `episodes_cut`.
        """
        assistant_seen = 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            if assistant_seen >= len(traj.steps):
                break
            step = traj.steps[assistant_seen]
            assistant_seen += 1
            if step.is_copied_context or not _parsed(step.parse_kind):
                left_out = sum(m["role"] == "assistant" for m in messages[i:])
                if step.is_copied_context:
                    rest = traj.steps[assistant_seen - 1 : assistant_seen - 1 + left_out]
                    copied = sum(s.is_copied_context for s in rest)
                    self.counts["copied_context_turns_cut"] += copied
                    self.counts["turns_after_copied_context_cut"] += left_out - copied
                else:
                    self.counts["unparsed_turns_cut"] += 1
                    self.counts["turns_after_unparsed_cut"] += left_out - 1
                self.counts["episodes_cut"] += 1
                kept = messages[:i]
                while kept and kept[-1]["role"] != "assistant":
                    kept.pop()
                if not kept:
                    self.counts[
                        "episodes_without_turn_before_copied_context"
                        if step.is_copied_context
                        else "episodes_without_parsed_turn"
                    ] += 1
                return kept
        return messages

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.counts.items()) if v}


def _tools_json(traj: Trajectory) -> str:
    """The episode's tools as OpenAI function schemas (the `tools` column TRL reads)."""
    return json.dumps([t.openai_tool() for t in tools_for(traj)], ensure_ascii=False)


def sft_rows(
    episodes: Iterable[SourceEpisode], *, prompt_style: PromptStyle | str = PromptStyle.FULL
) -> BuiltRows:
    """Verified, non-discarded episodes as chats weighted by their quality score, cut
    before any assistant turn that did not parse."""
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    manifest = _Manifest()
    for ep in episodes:
        if not ep.succeeded or ep.verdict == "discard" or ep.weight <= 0:
            continue
        messages = manifest.trained_chat(
            ep.trajectory, episode_messages(ep.trajectory, prompt_style)
        )
        if not _has_assistant_turn(messages):
            continue
        rows.append(
            {
                "messages": messages,
                "tools": _tools_json(ep.trajectory),
                "weight": ep.weight,
                "episode_id": str(ep.episode_id),
                **_task_coordinates(ep.trajectory),
            }
        )
        lineage.add(ep.episode_id, "example", ep.weight)
    return BuiltRows(rows=rows, lineage=lineage.entries(), manifest=manifest.as_dict())


def _divergence(
    chosen: Sequence[Message], rejected: Sequence[Message]
) -> tuple[list[Message], Message, Message] | None:
    """Shared history up to the first assistant turn where the two differ, and both turns.

    None when they differ before any assistant turn (different prompts or observations)
    or never differ in an assistant turn.
    """
    for i, (a, b) in enumerate(zip(chosen, rejected, strict=False)):
        if a == b:
            continue
        if a["role"] == "assistant" and b["role"] == "assistant":
            return list(chosen[:i]), a, b
        return None
    return None


def _turn_is_copied(traj: Trajectory, history: Sequence[Message]) -> bool:
    """The assistant turn after `history` (`episode_messages` order: the n-th assistant
    message is step n) is copied context (`Step.is_copied_context`)."""
    n = sum(m["role"] == "assistant" for m in history)
    return n < len(traj.steps) and traj.steps[n].is_copied_context


def dpo_rows(
    episodes: Iterable[SourceEpisode],
    *,
    pair_by: str = "task",
    max_pairs_per_group: int = 4,
    prompt_style: PromptStyle | str = PromptStyle.FULL,
) -> BuiltRows:
    """Success vs failure on the same task (or template): a step-level preference.

    Both episodes share the history up to the first assistant turn where they diverge; the
    successful episode's turn is `chosen`, the failed one's `rejected`. Observation tokens
    are never in the loss and the two completions answer exactly the same prompt.
    Discarded episodes (environment errors, broken format) are not used.
    """
    key: Callable[[Trajectory], str] = (
        (lambda t: t.task_id) if pair_by == "task" else (lambda t: f"{t.suite}/{t.template}")
    )
    groups: dict[str, list[SourceEpisode]] = defaultdict(list)
    for ep in episodes:
        if ep.verdict == "discard" or (
            ep.trajectory.status in INFRASTRUCTURE_STATUSES
            or ep.trajectory.status in OUTCOMELESS_STATUSES
        ):
            continue
        groups[key(ep.trajectory)].append(ep)
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    left_out: dict[str, int] = defaultdict(int)
    for group_key in sorted(groups):
        members = sorted(groups[group_key], key=lambda e: str(e.episode_id))
        wins = [e for e in members if e.succeeded]
        losses = [e for e in members if not e.succeeded]
        made = 0
        for win in wins:
            win_messages = episode_messages(win.trajectory, prompt_style)
            for loss in losses:
                if made >= max_pairs_per_group:
                    break
                split = _divergence(win_messages, episode_messages(loss.trajectory, prompt_style))
                if split is None:
                    continue
                prompt, chosen, rejected = split
                if _turn_is_copied(win.trajectory, prompt) or _turn_is_copied(
                    loss.trajectory, prompt
                ):
                    left_out["copied_context_pairs_left_out"] += 1
                    continue
                rows.append(
                    {
                        "prompt": prompt,
                        "chosen": [chosen],
                        "rejected": [rejected],
                        "weight": 1.0,
                        "chosen_episode_id": str(win.episode_id),
                        "rejected_episode_id": str(loss.episode_id),
                        **_task_coordinates(win.trajectory),
                    }
                )
                lineage.add(win.episode_id, "chosen", 1.0)
                lineage.add(loss.episode_id, "rejected", 1.0)
                made += 1
    return BuiltRows(rows=rows, lineage=lineage.entries(), manifest=dict(left_out))


def kto_rows(
    episodes: Iterable[SourceEpisode], *, prompt_style: PromptStyle | str = PromptStyle.FULL
) -> BuiltRows:
    """Every parsed assistant turn as an unpaired example, labelled by the episode's outcome.

    Turns that did not parse are left out of desirable examples (a verified episode may
    have recovered from a malformed turn; that turn is not what we want more of) and kept
    as undesirable ones.
    """
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    left_out: dict[str, int] = defaultdict(int)
    for ep in episodes:
        if ep.verdict == "discard" or (
            ep.trajectory.status in INFRASTRUCTURE_STATUSES
            or ep.trajectory.status in OUTCOMELESS_STATUSES
        ):
            continue
        messages = episode_messages(ep.trajectory, prompt_style)
        steps = iter(ep.trajectory.steps)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            step = next(steps)
            if step.is_copied_context:  # history of later turns, never a completion
                left_out["copied_context_turns_left_out"] += 1
                continue
            parsed = _parsed(step.parse_kind)
            label = ep.succeeded and parsed
            rows.append(
                {
                    "prompt": messages[:i],
                    "completion": [message],
                    "label": label,
                    "weight": ep.weight,
                    "episode_id": str(ep.episode_id),
                    "step_index": step.index,
                    **_task_coordinates(ep.trajectory),
                }
            )
            lineage.add(ep.episode_id, "desirable" if label else "undesirable", ep.weight)
    return BuiltRows(rows=rows, lineage=lineage.entries(), manifest=dict(left_out))


def grpo_rows(
    episodes: Iterable[SourceEpisode], *, prompt_style: PromptStyle | str = PromptStyle.FULL
) -> BuiltRows:
    """One prompt per distinct task (system + task); rollouts happen online in the sandbox."""
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    seen: set[str] = set()
    for ep in sorted(episodes, key=lambda e: (e.trajectory.task_id, str(e.episode_id))):
        if ep.verdict == "discard":
            continue
        if ep.trajectory.task_id in seen:
            continue
        seen.add(ep.trajectory.task_id)
        lineage.add(ep.episode_id, "prompt", 1.0)
        rows.append(
            {
                "prompt": prompt_messages(ep.trajectory, prompt_style),
                "weight": 1.0,
                "episode_id": str(ep.episode_id),
                **_task_coordinates(ep.trajectory),
            }
        )
    return BuiltRows(rows=rows, lineage=lineage.entries())


def _distill_rank(ep: SourceEpisode) -> tuple[int, int, float, str, str]:
    traj = ep.trajectory
    parse_errors = sum(s.parse_kind in (ParseKind.ERROR, ParseKind.NONE) for s in traj.steps)
    return (traj.n_steps, parse_errors, -ep.weight, traj.policy, str(ep.episode_id))


def distill_rows(
    episodes: Iterable[SourceEpisode], *, prompt_style: PromptStyle | str = PromptStyle.FULL
) -> BuiltRows:
    """Per task, the verified trajectory of the best teacher: shortest, then cleanest.

    Seed 003 §3 conflict arbitration: when teachers disagree, the verifier decides; among
    verified trajectories the shorter one wins (ties: fewer parse errors, higher quality,
    then policy name and id for determinism). Tasks no teacher solved contribute nothing.
    """
    by_task: dict[str, list[SourceEpisode]] = defaultdict(list)
    for ep in episodes:
        if ep.succeeded and ep.verdict != "discard":
            by_task[ep.trajectory.task_id].append(ep)
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    manifest = _Manifest()
    for task_id in sorted(by_task):
        candidates = by_task[task_id]
        best = min(candidates, key=_distill_rank)
        messages = manifest.trained_chat(
            best.trajectory, episode_messages(best.trajectory, prompt_style)
        )
        if not _has_assistant_turn(messages):
            continue
        rows.append(
            {
                "messages": messages,
                "tools": _tools_json(best.trajectory),
                "weight": best.weight,
                "episode_id": str(best.episode_id),
                "teacher": best.trajectory.policy,
                "n_candidates": len(candidates),
                "n_teachers": len({c.trajectory.policy for c in candidates}),
                **_task_coordinates(best.trajectory),
            }
        )
        lineage.add(best.episode_id, "example", best.weight)
    return BuiltRows(rows=rows, lineage=lineage.entries(), manifest=manifest.as_dict())


def cpt_rows(episodes: Iterable[SourceEpisode]) -> BuiltRows:
    """Every non-discarded episode as plain text, failures and observations included."""
    rows: list[dict[str, Any]] = []
    lineage = _Lineage()
    left_out: dict[str, int] = defaultdict(int)
    for ep in episodes:
        if ep.verdict == "discard" or not ep.trajectory.steps:
            continue
        left_out["copied_context_steps_left_out"] += sum(
            s.is_copied_context for s in ep.trajectory.steps
        )
        rows.append(
            {
                "text": plain_text(ep.trajectory),
                "weight": 1.0,
                "episode_id": str(ep.episode_id),
                "status": ep.trajectory.status.value,
                **_task_coordinates(ep.trajectory),
            }
        )
        lineage.add(ep.episode_id, "example", 1.0)
    return BuiltRows(
        rows=rows, lineage=lineage.entries(), manifest={k: v for k, v in left_out.items() if v}
    )


def build_rows(
    kind: DatasetKind,
    episodes: Sequence[SourceEpisode],
    *,
    pair_by: str = "task",
    prompt_style: PromptStyle | str = PromptStyle.FULL,
) -> BuiltRows:
    """Rows of `kind` from `episodes` (see the module docstring for the columns)."""
    style = PromptStyle(prompt_style)
    if kind == DatasetKind.SFT:
        return sft_rows(episodes, prompt_style=style)
    if kind == DatasetKind.DPO:
        return dpo_rows(episodes, pair_by=pair_by, prompt_style=style)
    if kind == DatasetKind.KTO:
        return kto_rows(episodes, prompt_style=style)
    if kind == DatasetKind.GRPO:
        return grpo_rows(episodes, prompt_style=style)
    if kind == DatasetKind.DISTILL:
        return distill_rows(episodes, prompt_style=style)
    return cpt_rows(episodes)

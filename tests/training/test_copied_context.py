"""Steps marked `is_copied_context` never become training targets, in every builder, and
the snapshot manifest counts them: Harbor's real summarisation sub-agent and continuation
files (`shared/interop/atif-linked/`, read in place) imported into SQL and the object store,
then made eligible for training (verified success, every assistant turn counted as parsed:
Terminus-2's JSON turns are not epiflow's protocol, and an unparsed turn is cut anyway)."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, select
from sqlmodel import col

from agent.trajectory import EpisodeStatus, FailureCategory, ParseKind, Trajectory
from models import Dataset
from storage.episodes import load_trajectory, persist_episodes
from storage.exchange import import_file
from storage.objects import LocalObjectStore
from tests.interop import linked_files
from tests.training.factory import episode
from training.builders import DatasetKind, SourceEpisode, build_rows
from training.conversations import plain_text
from training.snapshots import write_snapshot

SUMMARY = "terminus_2__hello-world-context-summarization.trajectory.summarization-1-summary.json"
CONTINUATION = "terminus_2__hello-world-context-summarization-linear-history.trajectory.cont-1.json"


def _imported(engine: Engine, store: LocalObjectStore, name: str) -> Trajectory:
    path = next(p for p in linked_files() if p.name == name)
    [episode_id] = import_file(engine, store, path, "atif").inserted
    return load_trajectory(engine, store, episode_id)


def _eligible(
    t: Trajectory, *, success: bool = True, episode_id: uuid.UUID | None = None
) -> Trajectory:
    steps = [
        s.model_copy(update={"parse_kind": ParseKind.FINAL, "final_answer": s.raw_output})
        for s in t.steps
    ]
    return t.model_copy(
        update={
            "episode_id": episode_id or t.episode_id,
            "steps": steps,
            "status": EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILED,
            "failure_category": FailureCategory.SUCCESS
            if success
            else FailureCategory.VERIFIER_FAILED,
        }
    )


def _copied_texts(t: Trajectory) -> set[str]:
    return {s.raw_output for s in t.steps if s.is_copied_context}


def _assistant_targets(kind: DatasetKind, rows: list[dict[str, object]]) -> list[str]:
    """The assistant text each row trains on."""
    out: list[str] = []
    for row in rows:
        if kind in (DatasetKind.SFT, DatasetKind.DISTILL):
            messages = row["messages"]
        elif kind == DatasetKind.KTO:
            messages = row["completion"]
        else:
            messages = [*row["chosen"], *row["rejected"]]  # type: ignore[misc]
        assert isinstance(messages, list)
        out += [m["content"] for m in messages if m["role"] == "assistant"]
    return out


def test_copied_context_is_marked_on_the_imported_steps(
    engine: Engine, store: LocalObjectStore
) -> None:
    summary = _imported(engine, store, SUMMARY)
    continuation = _imported(engine, store, CONTINUATION)
    assert [s.is_copied_context for s in summary.steps] == [True, True, False]
    assert [s.is_copied_context for s in continuation.steps] == [True, False, False, False, False]
    assert any(c.is_copied_context for c in summary.context_steps)


def test_no_builder_trains_on_copied_context_and_the_manifest_counts_it(
    engine: Engine, store: LocalObjectStore
) -> None:
    summary = _eligible(_imported(engine, store, SUMMARY))
    continuation = _eligible(_imported(engine, store, CONTINUATION))
    copied = _copied_texts(summary) | _copied_texts(continuation)
    assert len(copied) == 3
    ours = episode()  # an epiflow episode beside them, so that every snapshot has rows
    persist_episodes(engine, store, [ours])
    sources = [SourceEpisode(trajectory=t) for t in (summary, continuation, ours)]

    # Whole chats are cut before the first copied turn: here the copied turns come first.
    for kind in (DatasetKind.SFT, DatasetKind.DISTILL):
        built = build_rows(kind, sources)
        assert not copied & set(_assistant_targets(kind, built.rows)), kind
        if kind == DatasetKind.SFT:
            assert {r["episode_id"] for r in built.rows} == {str(ours.episode_id)}
            assert built.manifest == {
                "copied_context_turns_cut": 3,
                "turns_after_copied_context_cut": 5,
                "episodes_cut": 2,
                "episodes_without_turn_before_copied_context": 2,
            }
    # KTO: every new turn is a completion, with the copied turns in its prompt.
    kto = build_rows(DatasetKind.KTO, sources)
    targets = _assistant_targets(DatasetKind.KTO, kto.rows)
    assert not copied & set(targets)
    new_turns = [
        s.raw_output for t in (summary, continuation) for s in t.steps if not s.is_copied_context
    ]
    assert set(new_turns) <= set(targets)
    assert kto.manifest == {"copied_context_turns_left_out": 3}
    after_copied = next(r for r in kto.rows if r["episode_id"] == str(summary.episode_id))
    assert copied & {m["content"] for m in after_copied["prompt"] if m["role"] == "assistant"}
    # CPT: the text leaves copied steps out.
    cpt = build_rows(DatasetKind.CPT, sources)
    texts = " ".join(str(r["text"]) for r in cpt.rows)
    assert not any(c in texts for c in copied)
    assert all(
        s.raw_output in plain_text(summary) for s in summary.steps if not s.is_copied_context
    )
    assert cpt.manifest == {"copied_context_steps_left_out": 3}

    # The snapshot keeps the counts: `dataset.manifest` in SQL.
    for kind in (DatasetKind.SFT, DatasetKind.KTO, DatasetKind.CPT):
        built = build_rows(kind, sources)
        info = write_snapshot(engine, store, kind=kind, built=built, filter_={"test": kind.value})
        with engine.connect() as conn:
            manifest = conn.execute(
                select(col(Dataset.manifest)).where(col(Dataset.id) == info.id)
            ).scalar_one()
        assert manifest == built.manifest and manifest, kind


def test_dpo_never_pairs_at_a_copied_turn(engine: Engine, store: LocalObjectStore) -> None:
    imported = _imported(engine, store, SUMMARY)
    win = _eligible(imported)
    # A failed rollout that differs at the new turn: a pair, the copied turns in its prompt.
    late = _eligible(imported, success=False, episode_id=uuid.uuid4())
    late.steps[2].raw_output += " (but wrong)"
    # One that differs at a copied turn: never a pair.
    early = _eligible(imported, success=False, episode_id=uuid.uuid4())
    early.steps[0].raw_output += " (but wrong)"
    for loss, pairs, skipped in ((late, 1, {}), (early, 0, {"copied_context_pairs_left_out": 1})):
        built = build_rows(DatasetKind.DPO, [SourceEpisode(trajectory=t) for t in (win, loss)])
        assert len(built.rows) == pairs and built.manifest == skipped
        assert not _copied_texts(win) & set(_assistant_targets(DatasetKind.DPO, built.rows))

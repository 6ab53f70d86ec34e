"""Sub-agent and continuation links in SQL (`atif_document`, `episode_link`, the
`episode_tree` view) from Harbor's linked files (`shared/interop/atif-linked/`, read in
place) and an embedded v1.7 document, on real SQLite and PostgreSQL: linked whichever file
is imported first, a re-import changes no row, the tree's tokens and cost roll up, and an
export gives every file back."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlmodel import col

from models import Step
from storage.exchange import export_run, import_file
from storage.objects import LocalObjectStore
from tests.agent.test_atif_interop import without_epiflow
from tests.agent.test_atif_versions import v17
from tests.interop import linked_files, load

PARENT = "terminus_2__hello-world-context-summarization.trajectory.json"
SUMMARY = "terminus_2__hello-world-context-summarization.trajectory.summarization-1-summary.json"
QUESTIONS = (
    "terminus_2__hello-world-context-summarization.trajectory.summarization-1-questions.json"
)
LINEAR = "terminus_2__hello-world-context-summarization-linear-history.trajectory.json"
CONTINUATION = "terminus_2__hello-world-context-summarization-linear-history.trajectory.cont-1.json"


def _store(tmp_path: Path) -> LocalObjectStore:
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    return store


def _rows(engine: Engine, sql: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql))]


def _episode_of(engine: Engine) -> dict[str, Any]:
    """source file name → episode id (as the driver returns it)."""
    return {
        r["source_name"]: r["episode_id"]
        for r in _rows(engine, "SELECT source_name, episode_id FROM atif_document")
    }


def _own(document: dict[str, Any], field: str) -> Any:
    """A metric summed over the document's agent steps that are not copied context: what
    the tree counts for the node (None when no step reported it)."""
    values = [
        s["metrics"][field]
        for s in document["steps"]
        if s["source"] == "agent"
        and not s.get("is_copied_context")
        and (s.get("metrics") or {}).get(field) is not None
    ]
    return sum(values) if values else None


def _snapshot(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    return {
        table: _rows(engine, f"SELECT * FROM {table} ORDER BY 1, 2")
        for table in ("atif_document", "episode_link", "episode", "step")
    }


@pytest.mark.parametrize("order", ["parents_first", "children_first"])
def test_linked_files_are_linked_whichever_comes_first(
    migrated_engine: Engine, tmp_path: Path, order: str
) -> None:
    files = sorted(linked_files(), key=lambda p: (p.name not in (PARENT, LINEAR), p.name))
    if order == "children_first":
        files.reverse()
    store = _store(tmp_path)
    for path in files:
        import_file(migrated_engine, store, path, "atif")
    ids = _episode_of(migrated_engine)
    assert set(ids) == {p.name for p in linked_files()}
    links = {
        (r["parent_episode_id"], r["kind"], r["ordinal"]): r
        for r in _rows(migrated_engine, "SELECT * FROM episode_link")
    }
    parent, linear = ids[PARENT], ids[LINEAR]
    # The parent's system step names three sub-agents; the third file is not in the set.
    assert [links[(parent, "subagent", n)]["child_episode_id"] for n in range(3)] == [
        ids[SUMMARY],
        ids[QUESTIONS],
        None,
    ]
    first = links[(parent, "subagent", 0)]
    assert first["step_id"] == 5 and first["ref_path"] == "trajectory.summarization-1-summary.json"
    assert (
        first["ref_session_id"]
        == load(next(p for p in linked_files() if p.name == SUMMARY))["session_id"]
    )
    extra = first["ref_extra"]  # a raw query: SQLite gives JSON back as text
    assert (json.loads(extra) if isinstance(extra, str) else extra) == {
        "summary": "Context summarization 1: Step 1 - Summary generation"
    }
    # The linear-history file's sub-agents have other session ids: none of them is here.
    assert [links[(linear, "subagent", n)]["child_episode_id"] for n in range(3)] == [None] * 3
    continuation = links[(linear, "continuation", 0)]
    assert continuation["child_episode_id"] == ids[CONTINUATION]
    assert continuation["ref_path"] == "trajectory.cont-1.json"
    assert continuation["step_id"] is None
    sessions = {
        r["source_name"]: r["session_id"]
        for r in _rows(migrated_engine, "SELECT source_name, session_id FROM atif_document")
    }
    assert sessions == {p.name: load(p)["session_id"] for p in linked_files()}


def test_the_tree_view_walks_a_session_with_costs_rolled_up(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    for path in linked_files():
        import_file(migrated_engine, store, path, "atif")
    ids = _episode_of(migrated_engine)
    docs = {p.name: load(p) for p in linked_files()}
    tree = {
        r["episode_id"]: r
        for r in _rows(migrated_engine, "SELECT * FROM episode_tree ORDER BY root_episode_id, path")
    }
    assert len(tree) == 5  # two roots, each with what it links to
    by_name = {name: tree[eid] for name, eid in ids.items()}
    root = by_name[PARENT]
    assert (root["link_kind"], root["depth"], root["path"], root["parent_episode_id"]) == (
        "root",
        0,
        "root",
        None,
    )
    for name, n in ((SUMMARY, 0), (QUESTIONS, 1)):
        node = by_name[name]
        assert node["root_episode_id"] == ids[PARENT] and node["parent_episode_id"] == ids[PARENT]
        assert (node["link_kind"], node["depth"], node["path"]) == (
            "subagent",
            1,
            f"root/subagent.{n}",
        )
        assert node["session_id"] == docs[name]["session_id"]
        assert node["root_session_id"] == docs[PARENT]["session_id"]
    cont = by_name[CONTINUATION]
    assert (cont["root_episode_id"], cont["link_kind"], cont["path"]) == (
        ids[LINEAR],
        "continuation",
        "root/continuation.0",
    )
    # Copied context is counted, and left out of the tokens and cost.
    copied = {
        n: sum(bool(s.get("is_copied_context")) for s in d["steps"] if s["source"] == "agent")
        for n, d in docs.items()
    }
    assert copied[SUMMARY] == 2 and copied[CONTINUATION] == 1
    for name, node in by_name.items():
        assert node["copied_steps"] == copied[name], name
        assert node["prompt_tokens"] == _own(docs[name], "prompt_tokens"), name
        assert node["cost_usd"] == pytest.approx(_own(docs[name], "cost_usd")), name
    # A parent's subtree is itself and everything below it; a leaf's is its own.
    for name, below in ((PARENT, (SUMMARY, QUESTIONS)), (LINEAR, (CONTINUATION,))):
        node = by_name[name]
        members = (name, *below)
        assert node["subtree_cost_usd"] == pytest.approx(
            sum(_own(docs[m], "cost_usd") for m in members)
        )
        assert node["subtree_prompt_tokens"] == sum(_own(docs[m], "prompt_tokens") for m in members)
        assert node["subtree_completion_tokens"] == sum(
            _own(docs[m], "completion_tokens") for m in members
        )
    assert by_name[SUMMARY]["subtree_cost_usd"] == pytest.approx(_own(docs[SUMMARY], "cost_usd"))
    # The cookbook's query: a session's trees, by the root's session id (Harbor normalised
    # both parents' session ids to one value, so the session holds both trees).
    with migrated_engine.connect() as conn:
        session = conn.execute(
            text(
                "SELECT root_episode_id, path FROM episode_tree WHERE root_session_id = :s "
                "ORDER BY root_episode_id, path"
            ),
            {"s": docs[PARENT]["session_id"]},
        ).all()
    assert len(session) == 5 and {r.root_episode_id for r in session} == {ids[PARENT], ids[LINEAR]}


def test_copied_context_steps_are_marked_in_sql(migrated_engine: Engine, tmp_path: Path) -> None:
    store = _store(tmp_path)
    path = next(p for p in linked_files() if p.name == SUMMARY)
    [episode] = import_file(migrated_engine, store, path, "atif").inserted
    with migrated_engine.connect() as conn:
        marks = list(
            conn.execute(
                select(col(Step.is_copied_context))
                .where(col(Step.episode_id) == episode)
                .order_by(col(Step.step_index))
            ).scalars()
        )
    document = load(path)
    assert marks == [
        bool(s.get("is_copied_context")) for s in document["steps"] if s["source"] == "agent"
    ]
    assert marks == [True, True, False]


def test_reimport_changes_no_row_and_export_gives_every_file_back(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    for path in linked_files():
        import_file(migrated_engine, store, path, "atif")
    before = _snapshot(migrated_engine)
    for path in reversed(linked_files()):
        again = import_file(migrated_engine, store, path, "atif")
        assert again.inserted == [] and again.links_resolved == 0
    assert _snapshot(migrated_engine) == before
    out = tmp_path / "out.jsonl"
    assert export_run(migrated_engine, store, "import:atif", "atif", out) == 5
    exported = [without_epiflow(json.loads(line)) for line in out.read_text("utf-8").splitlines()]
    originals = [load(p) for p in linked_files()]
    assert sorted(exported, key=json.dumps) == sorted(originals, key=json.dumps)


def test_embedded_sub_agents_are_episodes_linked_by_trajectory_id(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    document = v17()
    unreferenced = copy.deepcopy(document["subagent_trajectories"][0])
    unreferenced["trajectory_id"] = "embedded-only"
    document["subagent_trajectories"].append(unreferenced)
    path = tmp_path / "v17.trajectory.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    store = _store(tmp_path)
    report = import_file(migrated_engine, store, path, "atif")
    assert len(report.inserted) == 4  # the parent and its three embedded sub-agents
    assert report.links_resolved == 3
    docs = _rows(migrated_engine, "SELECT * FROM atif_document")
    parent = next(d for d in docs if d["embedded_in"] is None)
    assert parent["trajectory_id"] == "parent-1" and parent["session_id"] is None
    children = {d["trajectory_id"]: d for d in docs if d["embedded_in"] is not None}
    assert set(children) == {"summary-1", "questions-1", "embedded-only"}
    assert all(d["embedded_in"] == parent["episode_id"] for d in children.values())
    links = _rows(
        migrated_engine,
        "SELECT ordinal, ref_trajectory_id, child_episode_id, step_id "
        "FROM episode_link ORDER BY ordinal",
    )
    assert [(r["ref_trajectory_id"], r["child_episode_id"]) for r in links] == [
        ("summary-1", children["summary-1"]["episode_id"]),
        ("questions-1", children["questions-1"]["episode_id"]),
        (None, None),  # the answers sub-agent, by a path to a file not imported
        ("embedded-only", children["embedded-only"]["episode_id"]),
    ]
    assert links[0]["step_id"] == links[2]["step_id"] == 5
    assert links[3]["step_id"] is None  # embedded, named by no step
    tree = _rows(migrated_engine, "SELECT path, depth FROM episode_tree ORDER BY path")
    assert [(r["path"], r["depth"]) for r in tree] == [
        ("root", 0),
        ("root/subagent.0", 1),
        ("root/subagent.1", 1),
        ("root/subagent.3", 1),
    ]
    before = _snapshot(migrated_engine)
    assert import_file(migrated_engine, store, path, "atif").inserted == []
    assert _snapshot(migrated_engine) == before
    out = tmp_path / "out.jsonl"
    # The sub-agents go out inside their parent's document, as they came in.
    assert export_run(migrated_engine, store, "import:atif", "atif", out) == 1
    [line] = out.read_text(encoding="utf-8").splitlines()
    assert without_epiflow(json.loads(line)) == document

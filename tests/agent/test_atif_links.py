"""How a sub-agent or continuation reference picks its document (`agent.atif_links`), and
what `document_links` reads from Harbor's real parent file (read in place)."""

from __future__ import annotations

import uuid

from agent.atif_links import (
    DocumentIdentity,
    LinkKind,
    LinkRef,
    document_links,
    resolve,
    with_embedded,
)
from tests.interop import interop_dir, load


def _doc(
    name: str | None, folder: str = "/runs/a", **kw: str | uuid.UUID | None
) -> DocumentIdentity:
    return DocumentIdentity(episode_id=uuid.uuid4(), source_name=name, source_dir=folder, **kw)


def test_a_path_resolves_to_a_renamed_copy_in_the_referrers_folder_first() -> None:
    referrer = _doc("trial-1.trajectory.json", session_id="s")
    here = _doc("trial-1.trajectory.cont-1.json")
    elsewhere = _doc("trajectory.cont-1.json", folder="/runs/b")
    unrelated = _doc("trial-1.trajectory.cont-10.json")
    ref = LinkRef(kind=LinkKind.CONTINUATION, ordinal=0, path="trajectory.cont-1.json")
    assert resolve(ref, referrer, [elsewhere, unrelated, here]) == here.episode_id
    assert resolve(ref, referrer, [elsewhere, unrelated]) == elsewhere.episode_id
    assert resolve(ref, referrer, [unrelated]) is None


def test_same_folder_ties_go_to_the_longest_common_name_prefix() -> None:
    referrer = _doc("trial-1.trajectory.json")
    mine = _doc("trial-1.trajectory.cont-1.json")
    theirs = _doc("trial-2.trajectory.cont-1.json")
    ref = LinkRef(kind=LinkKind.CONTINUATION, ordinal=0, path="trajectory.cont-1.json")
    assert resolve(ref, referrer, [theirs, mine]) == mine.episode_id
    assert resolve(ref, referrer, [mine, theirs]) == mine.episode_id


def test_a_session_ref_never_resolves_to_the_referrer_itself() -> None:
    referrer = _doc("parent.json", session_id="shared")
    child = _doc("child.json", session_id="shared")
    ref = LinkRef(kind=LinkKind.SUBAGENT, ordinal=0, session_id="shared")
    assert resolve(ref, referrer, [referrer]) is None
    assert resolve(ref, referrer, [referrer, child]) == child.episode_id


def test_a_trajectory_id_prefers_the_referrers_embedded_sub_agent() -> None:
    referrer = _doc("parent.json")
    embedded = _doc("parent.json", embedded_in=referrer.episode_id, trajectory_id="t1")
    other = _doc("other.json", trajectory_id="t1")
    ref = LinkRef(kind=LinkKind.SUBAGENT, ordinal=0, trajectory_id="t1")
    assert resolve(ref, referrer, [other, embedded]) == embedded.episode_id
    assert resolve(LinkRef(kind=LinkKind.SUBAGENT, ordinal=0), referrer, [other]) is None


def test_the_harbor_parent_names_three_sub_agents_from_its_system_step() -> None:
    path = (
        interop_dir()
        / "atif-linked"
        / "terminus_2__hello-world-context-summarization.trajectory.json"
    )
    eid = uuid.uuid4()
    links = document_links(load(path), episode_id=eid, source=str(path))
    assert links.identity.source_name == path.name
    assert links.identity.source_dir == str(path.parent.resolve())
    assert [(r.kind, r.ordinal, r.step_id) for r in links.refs] == [
        (LinkKind.SUBAGENT, n, 5) for n in range(3)
    ]
    assert [r.session_id for r in links.refs] == [
        f"test-session-context-summarization-summarization-1-{k}"
        for k in ("summary", "questions", "answers")
    ]
    # An embedded child no ref names gets a link of its own after the refs.
    child = document_links(
        {"trajectory_id": "extra-1", "steps": []}, episode_id=uuid.uuid4(), embedded_in=eid
    )
    assert with_embedded(links, [child]).refs[-1] == LinkRef(
        kind=LinkKind.SUBAGENT, ordinal=3, trajectory_id="extra-1"
    )

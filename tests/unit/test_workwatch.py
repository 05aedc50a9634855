"""The operator's own ManifestWork store (workwatch.py): what each watch event and (re)list
leaves in it, whom it wakes, when it is complete, and which namespaces a stream covers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import pytest

from hub_controller.aggregator.scope import OwnerKey, WorkScope
from hub_controller.operator.workwatch import WorkStore, _matcher
from ocmfl import constants


def work(cluster: str, owner: str = "fl", uid: str = "u1", applied: bool = False) -> Any:
    labels = {
        constants.LABEL_OWNER_NAMESPACE: "tenant",
        constants.LABEL_OWNER_NAME: owner,
        constants.LABEL_OWNER_UID: uid,
    }
    conds = [{"type": "Applied", "status": "True"}] if applied else []
    return {
        "metadata": {"namespace": cluster, "name": f"{owner}-work", "labels": labels},
        "status": {"conditions": conds},
    }


def owners(s: WorkStore) -> Mapping[OwnerKey, Iterable[tuple[str, str]]]:
    """The store's owners view as WorkScope reads it (only its `get`), as the hub passes it."""
    return cast(Mapping[OwnerKey, Iterable[tuple[str, str]]], s.owners)


def store() -> tuple[WorkStore, list[tuple[str, str]]]:
    s = WorkStore()
    woken: list[tuple[str, str]] = []
    s.on_change = woken.append
    return s, woken


def test_events_keep_works_by_owner_and_owners_by_cluster_and_wake_the_owner() -> None:
    s, woken = store()
    key = ("tenant", "fl")
    s.event("ADDED", work("c1"))
    s.event("ADDED", work("c2"))
    s.event("ADDED", work("c1", owner="other", uid="u2"))
    assert sorted(w.cluster for w in s.works.get(key, [])) == ["c1", "c2"]
    assert s.owners.get(("c1", "u1"), ()) == [key]
    assert s.owners.get(("c1", "u2"), ()) == [("tenant", "other")]
    assert woken == [key, key, ("tenant", "other")]
    s.event("MODIFIED", work("c1", applied=True))
    assert {w.cluster: w.applied for w in s.works.get(key, [])} == {"c1": True, "c2": False}
    s.event("DELETED", work("c2"))
    s.event("DELETED", work("c2"))  # twice: nothing left to drop, nobody woken
    assert [w.cluster for w in s.works.get(key, [])] == ["c1"]
    assert s.owners.get(("c2", "u1"), ()) == ()
    assert woken[-1] == key and len(woken) == 5
    # A work whose owner labels went is no longer the owner's (and wakes it).
    unlabelled = work("c1")
    unlabelled["metadata"]["labels"] = {}
    s.event("MODIFIED", unlabelled)
    assert s.works.get(key, []) == []
    assert woken[-1] == key


def test_a_relist_replaces_its_streams_works_only_and_wakes_every_changed_owner() -> None:
    s, woken = store()
    s.event("ADDED", work("c1"))
    s.event("ADDED", work("c2", owner="gone", uid="u9"))
    s.event("ADDED", work("other-ns"))
    woken.clear()
    # The stream of namespaces c1..c3 relists: c2's work went meanwhile, c3 got one.
    s.listed([work("c1"), work("c3")], lambda ns: ns in ("c1", "c2", "c3"))
    assert sorted(w.cluster for w in s.works.get(("tenant", "fl"), [])) == [
        "c1",
        "c3",
        "other-ns",
    ]
    assert s.works.get(("tenant", "gone"), []) == []
    assert set(woken) == {("tenant", "fl"), ("tenant", "gone")}


def test_synced_once_listed_and_the_scope_marked_then() -> None:
    s, _ = store()
    early = WorkScope(owners(s), grace_s=30)
    s.when_synced(early.mark_ready)
    assert not early.ready()
    s._mark_synced()
    assert early.ready() and s.synced.is_set()
    late = WorkScope(owners(s), grace_s=30)
    s.when_synced(late.mark_ready)  # already synced: marked at once
    assert late.ready()
    s.event("ADDED", work("c1"))
    assert late.allows("c1", "tenant", "fl", "u1")
    assert not late.allows("c1", "tenant", "fl", "u2")


def test_namespace_patterns_like_kopfs() -> None:
    assert _matcher(["ns-*"])("ns-a") and not _matcher(["ns-*"])("other")
    assert _matcher(["!kube-*"])("c1") and not _matcher(["!kube-*"])("kube-system")
    assert not _matcher(["c*", "!c2"])("c2") and _matcher(["c*", "!c2"])("c1")


def test_a_stream_that_fails_unexpectedly_is_said_and_followed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error list_watch does not expect (not a KubeError) would end the stream's thread,
    and every resource's first pass would wait for `synced` without a word."""
    s, woken = store()

    class FailsOnce:
        calls = 0

        def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
            FailsOnce.calls += 1
            if FailsOnce.calls == 1:
                raise RuntimeError("a decoder bug")
            return {"metadata": {"resourceVersion": "1"}, "items": [work("c1")]}

        def watch(self, *_: Any, **__: Any) -> Iterator[tuple[str, Any]]:
            s.stop.wait(5)
            return iter(())

    with caplog.at_level("ERROR", logger="hub_controller.operator.workwatch"):
        s.start(cast(Any, FailsOnce()))
        try:
            assert s.synced.wait(10) and s.pending == set()
        finally:
            s.close()
    assert "failed; following it again" in caplog.text and "a decoder bug" in caplog.text
    assert woken == [("tenant", "fl")]

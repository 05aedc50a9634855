"""The decided clusters a resource's loop acts on while OCM rewrites its decisions
(membership.settle_decisions): OCM writes sorted slices of at most 100 clusters one object at
a time, so a read can fall between two writes."""

from __future__ import annotations

import random
from collections.abc import Iterator

from hub_controller.membership import (
    DECISION_HOLD_S,
    DecisionView,
    decision_index,
    in_slice_gap,
    settle_decisions,
)

Slices = list[tuple[int, tuple[str, ...]]]


def ocm_slices(clusters: set[str]) -> Slices:
    """What OCM's placement controller writes: the clusters sorted, 100 per slice, numbered
    from 1 (scheduling_controller.go, generateDecision)."""
    ordered = sorted(clusters)
    return [(i // 100 + 1, tuple(ordered[i : i + 100])) for i in range(0, len(ordered), 100)]


def rewrite(old: set[str], new: set[str]) -> Iterator[Slices]:
    """Each state a reader can see while OCM goes from `old`'s slices to `new`'s: the slices
    patched in order (bind), then the ones no longer needed deleted."""
    before, after = dict(ocm_slices(old)), dict(ocm_slices(new))
    current = dict(before)
    for index, clusters in sorted(after.items()):
        if current.get(index) != clusters:
            current[index] = clusters
            yield sorted(current.items())
    for index in sorted(set(current) - set(after)):
        del current[index]
        yield sorted(current.items())


def names(n: int) -> set[str]:
    return {f"cluster-{i:04d}" for i in range(0, 2 * n, 2)}  # room to join in between


def settled(clusters: set[str], now: float = 0.0) -> DecisionView:
    return settle_decisions(ocm_slices(clusters), len(clusters), DecisionView(), now)


def test_decisions_are_numbered_from_the_name_ocm_gives_them() -> None:
    assert decision_index("digits-decision-12") == 12
    assert decision_index("odd") == 0


def test_nothing_is_decided_until_the_placement_has_made_all_of_its_decisions() -> None:
    clusters = names(250)
    slices = ocm_slices(clusters)
    view = DecisionView()
    for written in range(1, len(slices)):
        # OCM writes the Placement's count only after every slice.
        view = settle_decisions(slices[:written], None, view, now=0.1 * written)
        assert view.decided == frozenset()
    view = settle_decisions(slices, len(clusters), view, now=1.0)
    assert view.decided == clusters
    assert view.recheck_in(1.0) is None


def test_an_incomplete_first_set_is_taken_after_the_hold() -> None:
    slices = ocm_slices(names(150))[:1]  # the count never comes (say, OCM keeps failing)
    view = settle_decisions(slices, None, DecisionView(), now=10.0)
    assert view.decided == frozenset() and view.recheck_in(10.0) == DECISION_HOLD_S
    view = settle_decisions(slices, None, view, now=10.0 + DECISION_HOLD_S)
    assert view.decided == set(slices[0][1])


def test_a_join_that_shifts_slices_never_drops_a_cluster_that_stays() -> None:
    """The case that matters: a join sorting before the end moves one cluster per slice into
    the next; between the two writes that cluster is in no decision. Its work would be
    deleted and created again (its training restarted)."""
    old = names(350)
    new = old | {"cluster-0101"}  # sorts into the first slice
    states = list(rewrite(old, new))
    union_lost = [old - {c for _, s in st for c in s} for st in states]
    assert any(union_lost), "the plain union loses a cluster mid-rewrite (what is guarded)"
    view = settled(old)
    for now, state in enumerate(states, 1):
        view = settle_decisions(state, len(old), view, now=0.01 * now)  # count not yet new
        assert old <= view.decided
    view = settle_decisions(states[-1], len(new), view, now=0.1)
    assert view.decided == new and not view.held


def test_random_joins_and_leaves_keep_every_staying_cluster_and_settle_on_the_new_set() -> None:
    rng = random.Random(7)
    for _ in range(40):
        old = names(rng.randint(1, 450))
        joins = {f"cluster-{2 * rng.randint(0, 500) + 1:04d}" for _ in range(rng.randint(0, 3))}
        leaves = set(rng.sample(sorted(old), rng.randint(0, min(3, len(old) - 1))))
        new = (old | joins) - leaves
        view = settled(old)
        for step, state in enumerate(rewrite(old, new), 1):
            view = settle_decisions(state, len(old), view, now=0.01 * step)
            assert old - leaves <= view.decided  # a staying cluster is never dropped
        view = settle_decisions(ocm_slices(new), len(new), view, now=1.0)
        assert new <= view.decided
        # A leaver is gone at once, unless it sits between two slices after the rewrite:
        # then it goes when its hold ends.
        new_slices = [clusters for _, clusters in ocm_slices(new)]
        assert view.held.keys() == {c for c in leaves if in_slice_gap(c, new_slices)}
        view = settle_decisions(ocm_slices(new), len(new), view, now=0.01 + DECISION_HOLD_S)
        assert view.decided == new


def test_a_leave_waits_for_the_placements_count_then_goes() -> None:
    old = names(250)
    leaver = max(old)  # in the last slice: nothing else moves
    new = old - {leaver}
    view = settled(old)
    view = settle_decisions(ocm_slices(new), len(old), view, now=1.0)  # count not yet written
    assert leaver in view.decided
    assert view.recheck_in(1.0) == DECISION_HOLD_S
    view = settle_decisions(ocm_slices(new), len(new), view, now=1.2)
    assert view.decided == new


def test_a_leave_whose_count_never_comes_ends_with_the_hold() -> None:
    old = names(50)
    new = old - {min(old)}
    view = settle_decisions(ocm_slices(new), len(old), settled(old), now=1.0)
    assert min(old) in view.decided
    view = settle_decisions(ocm_slices(new), len(old), view, now=1.0 + DECISION_HOLD_S)
    assert view.decided == new

"""Unit tests for agents.model.batcher: size and oldest-item-age release, FIFO take (fake clock)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.model.batcher import Batcher, Pending

PROPERTY = hsettings(max_examples=150, derandomize=True, database=None, deadline=None)
MakeBatcher = Callable[..., Batcher[str]]


@pytest.fixture
def make() -> MakeBatcher:
    """Factory for batchers of strings."""

    def build(max_batch_size: int = 4, max_wait_s: float = 0.010) -> Batcher[str]:
        return Batcher(max_batch_size, max_wait_s)

    return build


def test_empty_batcher(make: MakeBatcher) -> None:
    """Empty: no due time, never ready, take() gives nothing."""
    b = make()
    assert len(b) == 0
    assert b.due_at() is None
    assert b.ready(0.0) is False
    assert b.ready(1e9) is False
    assert b.take() == []


def test_release_on_size(make: MakeBatcher) -> None:
    """With max_batch_size items the batch is ready at once, whatever the wait bound."""
    b = make(max_batch_size=3, max_wait_s=60.0)
    b.add("a", 100.0)
    b.add("b", 100.5)
    assert b.ready(100.5) is False
    b.add("c", 101.0)
    assert b.ready(101.0) is True
    assert b.due_at() == 100.0  # already past: due since the oldest arrived
    assert [p.item for p in b.take()] == ["a", "b", "c"]


def test_release_on_age_of_oldest(make: MakeBatcher) -> None:
    """A partial batch is due max_wait_s after its oldest item arrived."""
    b = make(max_batch_size=10, max_wait_s=0.010)
    b.add("a", 5.000)
    assert b.due_at() == pytest.approx(5.010)
    assert b.ready(5.009) is False
    assert b.ready(5.010) is True
    assert b.ready(7.0) is True


def test_newer_items_do_not_postpone_due_at(make: MakeBatcher) -> None:
    """Adding items keeps the due time of the oldest one: it is not a sliding or periodic timer."""
    b = make(max_batch_size=10, max_wait_s=1.0)
    b.add("a", 10.0)
    due = b.due_at()
    for i, t in enumerate((10.2, 10.5, 10.9)):
        b.add(f"n{i}", t)
        assert b.due_at() == due == 11.0
    assert b.ready(10.99) is False
    assert b.ready(11.0) is True


def test_due_at_moves_to_next_oldest_after_take(make: MakeBatcher) -> None:
    """After a take, the remaining oldest item sets the new due time."""
    b = make(max_batch_size=2, max_wait_s=1.0)
    for item, t in (("a", 0.0), ("b", 0.1), ("c", 0.7), ("d", 0.8), ("e", 0.9)):
        b.add(item, t)
    assert b.ready(0.9) is True  # full
    assert [p.item for p in b.take()] == ["a", "b"]
    assert b.due_at() == 0.7  # still full (c, d)
    assert [p.item for p in b.take()] == ["c", "d"]
    assert b.due_at() == pytest.approx(1.9)  # only e left: its age decides
    assert b.ready(1.8) is False


def test_take_returns_at_most_max_batch_size_in_fifo_order(make: MakeBatcher) -> None:
    """take() hands out the oldest max_batch_size items and leaves the rest queued."""
    b = make(max_batch_size=4)
    for i in range(10):
        b.add(f"i{i}", float(i))
    first = b.take()
    assert [p.item for p in first] == ["i0", "i1", "i2", "i3"]
    assert [p.arrived for p in first] == [0.0, 1.0, 2.0, 3.0]
    assert len(b) == 6
    assert [p.item for p in b.take()] == ["i4", "i5", "i6", "i7"]
    assert [p.item for p in b.take()] == ["i8", "i9"]
    assert len(b) == 0
    assert b.due_at() is None


def test_take_on_partial_batch_returns_everything(make: MakeBatcher) -> None:
    """A partial batch is taken whole."""
    b = make(max_batch_size=5)
    b.add("x", 1.0)
    b.add("y", 2.0)
    assert b.take() == [Pending("x", 1.0, float("inf")), Pending("y", 2.0, float("inf"))]
    assert len(b) == 0


def test_zero_wait_is_ready_immediately(make: MakeBatcher) -> None:
    """max_wait_s=0 releases every item as soon as it arrives."""
    b = make(max_batch_size=8, max_wait_s=0.0)
    b.add("a", 3.0)
    assert b.due_at() == 3.0
    assert b.ready(3.0) is True


def test_batch_size_one(make: MakeBatcher) -> None:
    """max_batch_size=1: each item is its own batch, ready on arrival."""
    b = make(max_batch_size=1, max_wait_s=100.0)
    b.add("a", 1.0)
    b.add("b", 2.0)
    assert b.ready(1.0) is True
    assert [p.item for p in b.take()] == ["a"]
    assert [p.item for p in b.take()] == ["b"]


def test_pending_is_frozen() -> None:
    """Pending records are immutable."""
    p = Pending("a", 1.0, 2.0)
    with pytest.raises(AttributeError):
        p.arrived = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("size", "wait", "message"),
    [(0, 0.01, "max_batch_size"), (-1, 0.01, "max_batch_size"), (4, -0.001, "max_wait_s")],
)
def test_constructor_validation(size: int, wait: float, message: str) -> None:
    """Sizes below 1 and negative waits are rejected, naming the parameter."""
    with pytest.raises(ValueError, match=message):
        Batcher(size, wait)


@PROPERTY
@given(
    st.integers(min_value=1, max_value=8),
    st.floats(min_value=0.0, max_value=5.0),
    st.lists(st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=2.0)), max_size=60),
)
def test_model_of_batcher(size: int, wait: float, ops: list[tuple[bool, float]]) -> None:
    """Against a model: FIFO order, batch sizes, due = oldest + wait (oldest when full)."""
    b: Batcher[int] = Batcher(size, wait)
    model: list[tuple[int, float]] = []
    taken: list[int] = []
    now = 0.0
    counter = 0
    for is_add, step in ops:
        now += step
        if is_add:
            b.add(counter, now)
            model.append((counter, now))
            counter += 1
        else:
            batch = b.take()
            assert len(batch) == min(size, len(model))
            assert [(p.item, p.arrived) for p in batch] == model[: len(batch)]
            del model[: len(batch)]
            taken += [p.item for p in batch]
        assert len(b) == len(model)
        if not model:
            assert b.due_at() is None
        elif len(model) >= size:
            assert b.due_at() == model[0][1]
            assert b.ready(now)
        else:
            assert b.due_at() == model[0][1] + wait
            assert b.ready(now) is (now >= model[0][1] + wait)
    assert taken == sorted(taken)

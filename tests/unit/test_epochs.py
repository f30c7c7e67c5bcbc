"""agents.ingest.epochs: scripted rebalance sequences against the consumer's assignment bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from agents.ingest.epochs import AssignmentEpochs

P0, P1 = ("tx", 0), ("tx", 1)


@dataclass(frozen=True)
class Rec:
    offset: int


def recs(*offsets: int) -> list[Rec]:
    return [Rec(o) for o in offsets]


def positioned() -> AssignmentEpochs:
    epochs = AssignmentEpochs()
    epochs.seek_done(epochs.seek_started())
    return epochs


def test_acks_of_a_batch_from_before_a_revocation_do_not_count() -> None:
    epochs = positioned()
    fetched_in = epochs.epoch
    assert epochs.accepts(fetched_in)
    epochs.revoke()
    assert not epochs.accepts(fetched_in) and epochs.stale_acks == 1
    assert epochs.accepts(epochs.epoch)


def test_a_new_epoch_holds_records_until_its_seek_then_releases_them_once_in_order() -> None:
    epochs = positioned()
    epochs.revoke()
    assert not epochs.positioned
    epochs.hold(P0, recs(12, 13))
    epochs.hold(P0, recs(10, 11, 12))  # fetched again around Faust's seeks
    epochs.hold(P1, recs(5))
    started = epochs.seek_started()
    epochs.seek_done(started)
    assert epochs.positioned and epochs.holding
    released = epochs.take_held()
    assert {p: [r.offset for r in rs] for p, rs in released.items()} == {P0: [10, 11, 12, 13], P1: [5]}
    assert not epochs.holding and epochs.take_held() == {}


def test_records_held_before_another_revocation_are_dropped() -> None:
    epochs = positioned()
    epochs.revoke()
    epochs.hold(P0, recs(1, 2))
    epochs.revoke()  # a second rebalance before the first one's seek: those records may not be ours
    epochs.seek_done(epochs.seek_started())
    assert epochs.take_held() == {}


def test_a_seek_that_started_before_a_revocation_does_not_position_the_new_epoch() -> None:
    epochs = positioned()
    started = epochs.seek_started()
    epochs.revoke()  # revoked while the seek awaited the broker
    epochs.seek_done(started)
    assert not epochs.positioned
    epochs.seek_done(epochs.seek_started())
    assert epochs.positioned


def test_a_seek_back_after_a_restore_does_not_hand_records_over_again() -> None:
    """Faust seeks to the committed offset again at the end of a restore, after records were handed over."""
    epochs = positioned()
    assert epochs.next_offset(P0, 100) == 100
    epochs.handed(P0, 150)  # records 100..149 went to the handler
    assert epochs.next_offset(P0, 100) == 150  # the read offset went back to the committed 100
    assert epochs.next_offset(P0, 170) == 170  # ahead of what was handed: the read offset wins
    assert epochs.next_offset(P1, None) is None


def test_a_revocation_forgets_what_was_handed_over() -> None:
    """After a rebalance the partition restarts from its committed offset, here or at its next owner."""
    epochs = positioned()
    epochs.handed(P0, 150)
    epochs.revoke()
    epochs.seek_done(epochs.seek_started())
    assert epochs.next_offset(P0, 120) == 120


def test_a_takeover_with_a_standby_and_a_restore_sequence() -> None:
    """Assign, restore (held), seek, hand over, end-of-restore seek back, revoke: each rule in turn."""
    epochs = AssignmentEpochs()
    epochs.hold(P0, recs(0, 1, 2))  # the standby's partition became active: fetched before any seek
    start = epochs.seek_started()
    epochs.seek_done(start)
    held = epochs.take_held()[P0]
    assert [r.offset for r in held] == [0, 1, 2]
    epochs.handed(P0, 3)
    epochs.seek_done(epochs.seek_started())  # the end of the restore seeks back to the committed 0
    assert epochs.next_offset(P0, 0) == 3
    fetched_in = epochs.epoch
    epochs.revoke()
    assert not epochs.accepts(fetched_in)
    assert not epochs.positioned

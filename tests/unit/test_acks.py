"""agents.ingest.acks: the committable offset of a partition, from scripted sequences of acks, gaps and seeks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agents.ingest.acks import AckLedger

TP = ("t", 0)


def test_acks_advance_the_committable_offset_only_over_contiguous_offsets() -> None:
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.begin(TP, 0, None)
    assert acks.ack(TP, [0, 1, 2, 3, 4, 6, 7], None) == 7
    assert acks.committable(TP, None) == 5
    assert acks.ack(TP, [5, 6], None) == 1  # 6 was done already
    assert acks.committable(TP, None) == 8


def test_a_missing_offset_right_after_the_committed_one_holds_the_commit() -> None:
    """Faust's ledger commits 33 here, past record 31, which is not done: a crash then loses it."""
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.ack(TP, [32], 31)  # a dead letter delivered before the prediction of record 31
    assert acks.committable(TP, 31) is None
    acks.ack(TP, [31], 31)
    assert acks.committable(TP, 31) == 33


def test_an_out_of_order_first_ack_does_not_move_the_start_of_an_uncommitted_partition() -> None:
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.begin(TP, 0, None)  # records handed over from offset 0
    acks.ack(TP, [1], None)
    assert acks.committable(TP, None) is None
    acks.ack(TP, [0], None)
    assert acks.committable(TP, None) == 2


def test_gaps_count_as_done_but_not_the_record_after_them() -> None:
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.ack(TP, [10, 11], 10)
    acks.gap(TP, 12, 14, 10)  # transaction markers: never delivered
    acks.ack(TP, [16], 10)
    assert acks.committable(TP, 10) == 15
    acks.ack(TP, [15], 10)
    assert acks.committable(TP, 10) == 17


def test_a_gap_at_the_committed_offset_counts() -> None:
    """After a transaction commits, the offset after it is its marker: the next owner starts there."""
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.gap(TP, 20, 20, 20)
    acks.ack(TP, [21, 22], 20)
    assert acks.committable(TP, 20) == 23


def test_acks_below_the_committed_offset_do_not_count_and_a_seek_forward_is_caught_up() -> None:
    acks: AckLedger[tuple[str, int]] = AckLedger()
    assert acks.ack(TP, [3, 4], 5) == 0
    assert acks.committable(TP, 5) is None
    acks.ack(TP, [5, 7], 5)
    assert acks.committable(TP, 5) == 6
    # Another commit (or a seek) moved the committed offset to 7: 7 is done, so 8 may be committed.
    assert acks.committable(TP, 7) == 8


def test_a_revoked_partition_starts_over_from_the_committed_offset() -> None:
    acks: AckLedger[tuple[str, int]] = AckLedger()
    acks.ack(TP, [0, 1, 2], 0)
    assert acks.committable(TP, 0) == 3
    acks.forget([TP])  # revoked before the commit: its records are delivered again from 0
    assert TP not in acks and acks.committable(TP, 0) is None
    acks.ack(TP, [1], 0)  # a redelivered record, done again, after one that is not yet
    assert acks.committable(TP, 0) is None


@given(st.data())
def test_the_committable_offset_is_the_first_offset_not_done(data: st.DataObject) -> None:
    committed = data.draw(st.integers(0, 5), label="committed")
    size = data.draw(st.integers(1, 40), label="offsets")
    gaps = data.draw(st.sets(st.integers(committed, committed + size - 1)), label="gap offsets")
    order = data.draw(st.permutations(list(range(committed, committed + size))), label="order")
    acks: AckLedger[tuple[str, int]] = AckLedger()
    done: set[int] = set()
    for offset in order:
        if offset in gaps:
            acks.gap(TP, offset, offset, committed)
        else:
            acks.ack(TP, [offset], committed)
        done.add(offset)
        first_missing = committed
        while first_missing in done:
            first_missing += 1
        expected = first_missing if first_missing > committed else None
        assert acks.committable(TP, committed) == expected

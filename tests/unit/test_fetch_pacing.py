"""The fetch wait follows the event loop's CPU share (agents/ingest/pacing.py), on an injected clock."""

from __future__ import annotations

import pytest

from agents.ingest.pacing import HIGH, HORIZON_S, LOW, MIN_STEP_S, FetchPacing


def run(pacing: FetchPacing, share: float, seconds: float, *, start: float = 0.0, cpu: float = 0.0,
        step_s: float = 0.1) -> tuple[float, float, list[int]]:
    """Feed ``seconds`` of rounds every ``step_s`` at a CPU ``share``; return the clock, the CPU and the waits set."""
    now, waits = start, []
    for _ in range(round(seconds / step_s)):
        now += step_s
        cpu += share * step_s
        wait = pacing.observe(now, cpu)
        if wait is not None:
            waits.append(wait)
    return now, cpu, waits


def test_an_idle_loop_keeps_the_short_wait_and_a_busy_one_gets_the_long() -> None:
    pacing = FetchPacing(10, 30)
    assert pacing.wait_ms == 10
    now, cpu, waits = run(pacing, 0.2, 5.0)
    assert waits == [] and pacing.wait_ms == 10  # never changed: nothing to tell the consumer
    now, cpu, waits = run(pacing, 0.95, 5 * HORIZON_S, start=now, cpu=cpu)
    assert pacing.wait_ms == 30 and waits[-1] == 30
    assert waits == sorted(waits)  # it rose step by step as the average did, never back
    _, _, waits = run(pacing, 0.1, 5 * HORIZON_S, start=now, cpu=cpu)
    assert pacing.wait_ms == 10 and waits[-1] == 10


@pytest.mark.parametrize("share", [LOW + (HIGH - LOW) / 4, (LOW + HIGH) / 2, HIGH - 0.01])
def test_between_the_two_shares_the_wait_is_in_proportion(share: float) -> None:
    pacing = FetchPacing(10, 30)
    run(pacing, share, 10 * HORIZON_S)
    assert pacing.share == pytest.approx(share, rel=1e-3)
    assert pacing.wait_ms == round(10 + 20 * (share - LOW) / (HIGH - LOW))


def test_rounds_closer_than_the_clock_resolves_are_measured_together() -> None:
    pacing = FetchPacing(10, 30)
    pacing.observe(0.0, 0.0)
    # A thread's CPU clock moves in ticks: a round of a millisecond reads 0 or 10 ms of CPU. Such rounds wait for
    # MIN_STEP_S to pass, and are then measured as one stretch.
    for i in range(1, 10):
        assert pacing.observe(i * MIN_STEP_S / 10, 0.01 if i % 2 else 0.0) is None
    assert pacing.share == 0.0
    pacing.observe(MIN_STEP_S, 0.9 * MIN_STEP_S)
    assert pacing.share == pytest.approx(0.9 * MIN_STEP_S / HORIZON_S)


def test_a_share_outside_zero_to_one_is_clamped() -> None:
    # The thread's CPU clock and the wall clock are read one after the other: a stretch can read a little over 1.
    pacing = FetchPacing(10, 30)
    run(pacing, 1.5, 10 * HORIZON_S)
    assert pacing.share == pytest.approx(1.0, rel=1e-3) and pacing.wait_ms == 30


def test_the_waits_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        FetchPacing(30, 10)
    with pytest.raises(ValueError):
        FetchPacing(-1, 10)
    assert FetchPacing(10, 10).wait_ms == 10
    with pytest.raises(ValueError):
        FetchPacing(10, 30, 0)


def test_the_bytes_a_fetch_waits_for_grow_with_its_wait() -> None:
    # Or a busy loop's longer wait would be cut short by the bytes an idle one waits for.
    pacing = FetchPacing(10, 30, 32 * 1024)
    assert pacing.min_bytes == 32 * 1024
    run(pacing, 0.95, 5 * HORIZON_S)
    assert pacing.wait_ms == 30 and pacing.min_bytes == 96 * 1024
    run(pacing, (LOW + HIGH) / 2, 20 * HORIZON_S, start=10.0, cpu=10.0)
    assert pacing.wait_ms == 20 and pacing.min_bytes == 64 * 1024
    # A fetch that never waits keeps its bytes, whatever the busy wait.
    assert FetchPacing(0, 30, 1000).min_bytes == 1000

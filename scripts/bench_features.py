#!/usr/bin/env python3
"""Feature-engine benchmark: event-time features for a stream of transactions, no Kafka.

    .venv/bin/python scripts/bench_features.py [--events 500000] [--cards 10000] [--hot 10000]

Measures the pure engine as the pipeline drives it: batches of events (the size a fetch returns),
per-partition watermark, per-card state held in memory (the worker's write-back cache) and updated
in arrival order. One process, one core.

``--hot N`` also measures hot keys: one card whose largest window (one hour) holds N events, against
one whose window holds 10, both fed one event at a time with event times jittered by up to a second
(some arrive out of order), each measured once its window is full.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from app.synthetic import TransactionGenerator
from tables.features import Watermark, apply_event, new_state


def run(events: list[dict], batch_size: int, lateness_ms: int) -> tuple[float, int, int]:
    states: dict[str, dict] = {}
    watermark = Watermark(lateness_ms)
    late = 0
    started = time.perf_counter()
    for start in range(0, len(events), batch_size):
        for tx in events[start:start + batch_size]:
            if watermark.is_late(tx["ts"]):
                late += 1
                continue
            watermark.observe(tx["ts"])
            card = tx["card_id"]
            state = states.get(card)
            if state is None:
                state = states[card] = new_state()
            apply_event(state, tx["id"], tx["ts"], (tx["amount"], tx["merchant_id"]), allowed_lateness_ms=lateness_ms)
    return time.perf_counter() - started, late, max(len(s["ts"]) for s in states.values())


def per_event_us(in_window: int, measured: int, seed: int = 5) -> tuple[float, int]:
    """Microseconds per event for one card whose one-hour window holds about ``in_window`` events."""
    rng = random.Random(seed)
    step_ms = 3_600_000 / in_window
    state = new_state()
    events = [(f"e{i}", int(i * step_ms + rng.uniform(-1000, 0)), rng.uniform(1, 500), f"m-{rng.randrange(50)}")
              for i in range(in_window + measured)]
    for event_id, ts, amount, merchant in events[:in_window]:  # fill the window, unmeasured
        apply_event(state, event_id, ts, (amount, merchant), allowed_lateness_ms=60_000)
    started = time.perf_counter()
    for event_id, ts, amount, merchant in events[in_window:]:
        apply_event(state, event_id, ts, (amount, merchant), allowed_lateness_ms=60_000)
    return (time.perf_counter() - started) / measured * 1e6, len(state["ts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--hot", type=int, default=0, metavar="N", help="also: a key with N events in its window")
    args = parser.parse_args()
    if args.hot:
        cold_us, cold_held = per_event_us(10, 20_000)
        hot_us, hot_held = per_event_us(args.hot, 5_000)
        print(f"hot keys: {cold_us:.1f} us per event with 10 events in the window ({cold_held} held), "
              f"{hot_us:.1f} us with {args.hot:,} ({hot_held:,} held): the hot key at "
              f"{cold_us / hot_us:.0%} of the per-event speed")
    generator = TransactionGenerator(cards=args.cards, seed=3)
    events = [next(generator)[0] for _ in range(args.events)]
    elapsed, late, longest = run(events, args.batch_size, 60_000)
    print(f"feature engine: {args.events:,} events, {args.cards:,} cards, batches of {args.batch_size}: "
          f"{args.events / elapsed:,.0f} events/s on one core ({elapsed:.2f} s; {late} late; "
          f"longest card state {longest} events; cpus {os.cpu_count()})")


if __name__ == "__main__":
    main()

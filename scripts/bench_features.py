#!/usr/bin/env python3
"""Feature-engine benchmark: event-time features for a stream of transactions, no Kafka.

    .venv/bin/python scripts/bench_features.py [--events 500000] [--cards 10000]

Measures the pure engine as the pipeline drives it: batches of events (the size a fetch returns),
per-partition watermark, per-card state held in memory (the worker's write-back cache) and updated
in arrival order. One process, one core.
"""

from __future__ import annotations

import argparse
import os
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
            apply_event(state, tx["id"], tx["ts"], tx["amount"], tx["merchant_id"], allowed_lateness_ms=lateness_ms)
    return time.perf_counter() - started, late, max(len(s["ts"]) for s in states.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    args = parser.parse_args()
    generator = TransactionGenerator(cards=args.cards, seed=3)
    events = [next(generator)[0] for _ in range(args.events)]
    elapsed, late, longest = run(events, args.batch_size, 60_000)
    print(f"feature engine: {args.events:,} events, {args.cards:,} cards, batches of {args.batch_size}: "
          f"{args.events / elapsed:,.0f} events/s on one core ({elapsed:.2f} s; {late} late; "
          f"longest card state {longest} events; cpus {os.cpu_count()})")


if __name__ == "__main__":
    main()

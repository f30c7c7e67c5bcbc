#!/usr/bin/env python3
"""Feature-engine benchmark: event-time features for a stream of transactions, no Kafka.

    .venv/bin/python scripts/bench_features.py [--events 500000] [--cards 10000] [--hot 10000]

Measures the pure engine as the pipeline drives it: batches of events (the size a fetch returns),
per-partition watermark, per-card state held in memory (the worker's write-back cache) and updated
in arrival order. One process, one core.

``--hot N`` also measures hot keys: one card whose largest window (one hour) holds N events, against
one whose window holds 10, both fed one event at a time with event times jittered by up to a second
(some arrive out of order), each measured once its window is full.

``--one-key RATE`` follows one key at RATE events per second of event time for ``--hours`` (1) and reports,
every tenth of it, the events its state holds, their memory (``tables.features.state_bytes``) and the bytes
its table holds (``tables.key_store``: the header and sealed chunks, as a flush writes them), with the
microseconds per event of that stretch: what exact windows make a key's state cost as its rate grows. With
``--tiled`` the key reads its events back from that table, as a worker's state cache lets a hot key do, and
tiles those below its raw band (``tables.tiles``): its memory then stops growing at the raw band.

``--growth MINUTES`` drives the engine as a worker under steady load does: ``--cards`` keys, ``--rate``
events per second of event time, each for a key drawn at random, every key's state held in memory and
written behind (``tables.key_store.changes``, what a flush encodes) every quarter of a second of event
time, with the worker's garbage collection (after each write, a young collection that freezes what it
leaves: ``app.scoring``). Every minute of event time it reports the events a key holds and the microseconds
per event of applying (``apply_event``), of writing and of collecting: how a worker's cost per event grows
as its states do. The same
events per key over fewer keys (``--cards 5000 --rate 375`` against ``--cards 100000 --rate 7500``) tell
the part that is the number of keys (memory the processor's caches do not hold) from the part that is the
events each key holds.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

from app.synthetic import TransactionGenerator
from tables.features import Watermark, apply_event, new_state, state_bytes
from tables.key_store import Packed, Stored, changes, cut_below, events_between, stored_key
from tables.tiles import Events


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


class _Table:
    """One key's table as a flush leaves it (a rewritten chunk replaces its earlier version), and what the key reads
    back from it when it tiles (``tables.tiles.Store``): every write reaches the table at once here."""

    def __init__(self, key: bytes) -> None:
        self.key, self.values, self.stored = key, {}, Stored()
        self.durable_tail: int | None = None
        self.unwritten_low: int | None = None  # the lowest time applied since the last write
        self.reads = 0

    def write(self, state: dict, touched: list[int]) -> None:
        self.stored = Stored.unpacked(self.stored.packed())  # as the state cache holds it between writes
        for table_key, value in changes(self.key, state, self.stored, touched):
            if value is None:
                self.values.pop(table_key, None)
            else:
                self.values[table_key] = value
        self.durable_tail, self.unwritten_low = self.stored.tail, None

    def bytes(self) -> int:
        return sum(len(key) + len(value) for key, value in self.values.items())

    def _held(self) -> Packed:
        """What the table holds of the key, as the state cache holds it (without copying its list of chunks)."""
        stored = self.stored
        return stored.chunks, stored.tail, stored.next_chunk, stored.n, stored.held, None  # type: ignore[return-value]

    def applied(self, ts: int) -> None:
        if self.unwritten_low is None or ts < self.unwritten_low:
            self.unwritten_low = ts

    def cut(self, below: int) -> int | None:
        if self.durable_tail is None:
            return None
        return cut_below(self._held(), self.durable_tail, below if self.unwritten_low is None
                         else min(below, self.unwritten_low))

    def read(self, lo: int, hi: int) -> Events:
        self.reads += 1
        return events_between(self.key, self._held(), lo, hi, lambda keys: [self.values.get(k) for k in keys])


def one_key(rate: float, hours: float, seed: int = 5, tiled: bool = False) -> list[dict[str, float]]:
    """One key at ``rate`` events per second of event time for ``hours``: its state's size every tenth of the run.

    The key's state is written as a flush writes it once a second of event time, so ``table_mb`` is what its
    table holds; with ``tiled`` the key reads its events back from that table.
    """
    rng = random.Random(seed)
    state, table = new_state(), _Table(stored_key("one-key"))
    if tiled:
        state.store = table
    total = int(rate * hours * 3600)
    step_ms, touched, rows = 1000 / rate, [], []
    started = time.perf_counter()
    for i in range(total):
        ts = int(i * step_ms)
        apply_event(state, f"e{i:09d}", ts, (round(rng.uniform(1, 500), 2), f"m-{rng.randrange(50)}"),
                    allowed_lateness_ms=60_000)
        touched.append(ts)
        if (i + 1) % max(1, int(rate)) == 0 or i == total - 1:  # a flush per second of event time
            table.write(state, touched)
            touched = []
        if (i + 1) % max(1, total // 10) == 0:
            rows.append({"event_time_s": round(ts / 1000), "events_held": len(state["ts"]),
                         "events_tiled": 0 if state.tiles is None else len(state.tiles),
                         "memory_mb": state_bytes(state) / 1e6, "table_mb": table.bytes() / 1e6,
                         "reads": table.reads, "us_per_event": (time.perf_counter() - started) / (total // 10) * 1e6})
            started = time.perf_counter()
    return rows


def growth(cards: int, rate: int, minutes: int, seed: int = 3) -> list[dict[str, float]]:
    """Per minute of event time: events per key held, and microseconds per event applying and writing."""
    rng = random.Random(seed)
    keys = [f"card-{i:06d}" for i in range(cards)]
    states: dict[str, dict] = {}
    written: dict[str, Stored] = {}
    per_write = max(1, rate // 4)  # events per quarter of a second of event time
    rows, arrived = [], 0
    gc.collect()
    gc.freeze()
    gc.disable()  # collected as the worker does, below
    for minute in range(minutes):
        applying = writing = collecting = 0.0
        for _ in range(60 * 4):
            touched: dict[str, set[int]] = {}
            started = time.perf_counter()
            for _ in range(per_write):
                ts = T0_MS + arrived * 1000 // rate
                key = keys[rng.randrange(cards)]
                state = states.get(key)
                if state is None:
                    state = states[key] = new_state()
                    written[key] = Stored()
                apply_event(state, f"{key}-{arrived:010d}", ts, (round(rng.uniform(1, 500), 2),
                                                                 f"m-{rng.randrange(2_000)}"),
                            allowed_lateness_ms=60_000)
                touched.setdefault(key, set()).add(ts)
                arrived += 1
            applied = time.perf_counter()
            for key, times in touched.items():
                stored = Stored.unpacked(written[key].packed())  # as the state cache holds it between writes
                changes(stored_key(key), states[key], stored, times)
                written[key] = stored
            wrote = time.perf_counter()
            gc.collect(0)
            gc.freeze()
            collecting += time.perf_counter() - wrote
            writing += wrote - applied
            applying += applied - started
        count = 60 * 4 * per_write
        rows.append({"minute": minute + 1, "events_per_key": sum(len(s["ts"]) for s in states.values()) / len(states),
                     "apply_us": applying / count * 1e6, "write_us": writing / count * 1e6,
                     "collect_us": collecting / count * 1e6})
    gc.enable()
    return rows


T0_MS = 1_764_547_200_000  # 2025-12-01, UTC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--hot", type=int, default=0, metavar="N", help="also: a key with N events in its window")
    parser.add_argument("--one-key", type=float, default=0.0, metavar="RATE",
                        help="only: one key at RATE events per second of event time, its state's size")
    parser.add_argument("--hours", type=float, default=1.0, help="with --one-key: hours of event time")
    parser.add_argument("--tiled", action="store_true", help="with --one-key: the key tiles (tables.tiles)")
    parser.add_argument("--growth", type=int, default=0, metavar="MINUTES",
                        help="only: --cards keys at --rate events/s of event time, cost per event minute by minute")
    parser.add_argument("--rate", type=int, default=7_500, help="with --growth: events per second of event time")
    args = parser.parse_args()
    if args.growth:
        for row in growth(args.cards, args.rate, args.growth):
            print(f"{args.cards:,} keys at {args.rate:,}/s, minute {row['minute']:>3}: {row['events_per_key']:6.1f} "
                  f"events a key, us per event: {row['apply_us']:5.1f} applied, {row['write_us']:5.1f} written, "
                  f"{row['collect_us']:4.1f} collected",
                  flush=True)
        return
    if args.one_key:
        for row in one_key(args.one_key, args.hours, tiled=args.tiled):
            print(f"one key at {args.one_key:g}/s{' (tiled)' if args.tiled else ''}, {row['event_time_s']:>6,} s "
                  f"of event time: {row['events_held']:>7,} events held raw, {row['events_tiled']:>7,} tiled, "
                  f"{row['memory_mb']:6.1f} MB in memory, {row['table_mb']:6.1f} MB in its table, "
                  f"{row['reads']:>5,} read back, {row['us_per_event']:5.1f} us per event")
        return
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

"""agents.checkpoint: the commit protocol's steps and their order, over small real parts and test doubles."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from agents import checkpoint as checkpoint_module
from agents.checkpoint import Checkpoint
from agents.ingest import SkipCommit
from agents.metrics import BoundaryMetrics
from tables.cache import StateCache
from tables.changelog import ChangelogWriter
from tables.features import KeyState, apply_event
from tables.key_store import Stored
from tests.unit.test_changelog import Table, scope_for

T = 1_764_500_000_000


class Scoring:
    """The scoring service as a checkpoint sees it, recording what is done to it, in order."""

    def __init__(self, cache: StateCache, log: list[str]) -> None:
        self.log = log
        self.pipeline: Any = SimpleNamespace(cache=cache, delivered=self._delivered)
        self.models: Any = SimpleNamespace(flush=self._flush)
        self.metrics = BoundaryMetrics()
        self.stopping = False
        self.crashed: list[BaseException] = []

    async def _delivered(self) -> None:
        self.log.append("outputs delivered")

    async def _flush(self) -> None:
        self.log.append("boundary drained")

    @property
    def should_stop(self) -> bool:
        return self.stopping

    async def crash(self, reason: BaseException) -> None:
        self.crashed.append(reason)


class App:
    rebalancing = False
    producer = SimpleNamespace(buffer=SimpleNamespace(size=0, state="running"))


def make_cache(table: Table, log: list[str]) -> tuple[StateCache, list[Any]]:
    """A state cache whose card writes go through ``write`` (set by the test): one record per card."""
    writer: list[Any] = []

    def store_state(card_id: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
        writer[0](table, 0, card_id.encode(), {"n": state["n"]})
        log.append(f"stage {card_id}")
        return 1

    cache = StateCache(load_state=lambda _c: None, store_state=store_state, load_watermark=lambda: None,
                       store_watermark=lambda _ts: None, scope=scope_for(table), allowed_lateness_ms=60_000)
    return cache, writer


def change(cache: StateCache, card_id: str) -> None:
    state = cache.state(0, card_id)
    apply_event(state, f"{card_id}-e{state['n']}", T + state["n"], (1.0, "m"), allowed_lateness_ms=60_000)
    cache.touch(0, card_id, T)


class Broker:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.fail: Exception | None = None
        self.records = 0

    async def send(self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]) -> list[int]:
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        self.log.append(f"changelog {len(records)}")
        first, self.records = self.records, self.records + len(records)
        return list(range(first, self.records))


@dataclass
class AtLeastOnce:
    """An at-least-once checkpoint over a real state cache and changelog writer, and its test doubles."""

    checkpoint: Checkpoint
    scoring: Scoring
    broker: Broker
    cache: StateCache
    table: Table
    log: list[str]


def at_least_once(write_interval_s: float = 0.25) -> AtLeastOnce:
    log: list[str] = []
    table, broker = Table("cards"), Broker(log)
    cache, writer = make_cache(table, log)
    changelog = ChangelogWriter(broker.send, scope_for(table))
    writer.append(changelog.write)
    scoring = Scoring(cache, log)
    checkpoint = Checkpoint(scoring, App(), changelog=changelog, write_interval_s=write_interval_s)
    return AtLeastOnce(checkpoint, scoring, broker, cache, table, log)


async def test_at_least_once_writes_the_state_then_the_changelog_and_releases_acks_only_then() -> None:
    at = at_least_once()
    checkpoint, scoring, cache, table, log = at.checkpoint, at.scoring, at.cache, at.table, at.log
    change(cache, "a")
    change(cache, "b")
    acked: list[str] = []
    cache.ack_when_flushed(cache.epoch, lambda: acked.append("ack"))
    await checkpoint.before_offsets()
    assert log == ["stage a", "stage b", "changelog 2"]
    assert acked == ["ack"]
    assert set(table.data.rows) == {(0, b'"a"'), (0, b'"b"')}  # in the local store too
    assert scoring.metrics.state_writes._value.get() == 2


async def test_a_changelog_that_cannot_be_written_skips_the_commit_and_stops_the_worker() -> None:
    at = at_least_once()
    checkpoint, scoring, broker, cache = at.checkpoint, at.scoring, at.broker, at.cache
    change(cache, "a")
    broker.fail = ConnectionError("broker gone")
    with pytest.raises(SkipCommit):
        await checkpoint.before_offsets()
    await asyncio.sleep(0)
    assert [type(e) for e in scoring.crashed] == [ConnectionError]
    change(cache, "b")
    broker.fail = None
    with pytest.raises(SkipCommit):  # and no later commit goes either
        await checkpoint.before_offsets()


async def test_exactly_once_drains_the_boundary_then_waits_for_outputs_then_stages_state() -> None:
    log: list[str] = []
    table = Table("cards")
    cache, writer = make_cache(table, log)
    staged: list[Any] = []
    writer.append(lambda *write: staged.append(write))
    transactions: Any = SimpleNamespace(staged=0)
    scoring = Scoring(cache, log)
    checkpoint = Checkpoint(scoring, App(), transactions=transactions)
    change(cache, "a")
    await checkpoint.before_offsets()
    assert log == ["boundary drained", "outputs delivered", "stage a"]
    assert len(staged) == 1 and table.data.rows == {}  # RocksDB gets it only after the commit


async def test_state_is_written_behind_between_commits_until_the_worker_stops() -> None:
    at = at_least_once(write_interval_s=0.01)
    checkpoint, scoring, cache, log = at.checkpoint, at.scoring, at.cache, at.log
    behind = asyncio.ensure_future(checkpoint.write_behind())
    change(cache, "a")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if "changelog 1" in log:
            break
    assert log == ["stage a", "changelog 1"]
    scoring.stopping = True
    await asyncio.wait_for(behind, 1)


def test_a_checkpoint_writes_state_one_way() -> None:
    log: list[str] = []
    cache, _ = make_cache(Table("cards"), log)
    with pytest.raises(ValueError):
        Checkpoint(Scoring(cache, log), App())


async def test_a_changelog_write_lost_while_stopping_skips_the_commit_without_a_crash() -> None:
    at = at_least_once()
    checkpoint, scoring, broker, cache = at.checkpoint, at.scoring, at.broker, at.cache
    change(cache, "a")
    broker.fail = ConnectionError("producer closed")
    scoring.stopping = True
    with pytest.raises(SkipCommit, match="while stopping"):
        await checkpoint.before_offsets()
    await asyncio.sleep(0)
    assert scoring.crashed == []



async def test_state_reaches_the_local_store_only_after_the_changelog_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write runs in steps, records are scored between them, and a crash can land anywhere.

    Stored step by step, a worker SIGKILLed between two steps and restarted on the same folder found
    some of a partition's cards written up to the middle of the write and the others not; a card
    loaded then raised the watermark past the others' unwritten events, which were routed late when
    they came again. The cards written stay cached until they are stored.
    """
    monkeypatch.setattr(checkpoint_module, "STEP_S", 0.0)  # let the loop run after every step
    at = at_least_once()
    for i in range(150):
        change(at.cache, f"c{i}")
    rows_seen: list[int] = []
    send = at.broker.send

    async def observed_send(topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]) -> list[int]:
        rows_seen.append(len(at.table.data.rows))
        return await send(topic, partition, records)

    at.broker.send = observed_send  # type: ignore[method-assign]
    at.checkpoint._changelog._send = observed_send  # type: ignore[union-attr]

    async def watch() -> None:
        while "changelog 150" not in at.log:
            rows_seen.append(len(at.table.data.rows))
            await asyncio.sleep(0)

    watching = asyncio.ensure_future(watch())
    await at.checkpoint.before_offsets()
    await watching
    assert len(rows_seen) > 3 and set(rows_seen) == {0}  # nothing stored during the steps or before the ack
    assert len(at.table.data.rows) == 150 and at.cache.cached_keys() == 150

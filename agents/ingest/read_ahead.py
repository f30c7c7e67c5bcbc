"""Records taken from the fetcher as each fetch returns, so that the next fetch is on its way while a round runs.

aiokafka's fetcher sends a broker its next fetch only once what the last one returned has been taken from it,
and the drain loop takes records only as a round begins. So a record that reaches the broker just after a fetch
left waits out the round that is running, then the fetch the next round starts, then that round: about two
rounds, and a round grows as the event loop fills. :class:`ReadAhead` takes what each fetch returns as soon as it
returns, on the consumer thread, into a buffer that the next round takes whole: the fetcher fetches again at once,
and a record waits about one round. The buffer holds at most ``limit`` records (``SEAM_FETCH_AHEAD_RECORDS``); at
the limit it stops taking, so the fetcher stops fetching and a slow worker reads no further ahead than before
(plus the one response the fetcher holds per broker). ``limit=0`` takes records only when a round asks, as
aiokafka does.

Taken records count as consumed for aiokafka (their partition's position moves past them), so the buffer keeps
aiokafka's own rule for records fetched but not yet returned: a seek drops them (the caller wants what follows
its offset; a seek can come from any thread, so the buffer is changed under a lock), and they are handed on only
in the assignment they were fetched in, with their partition's position still where they end. Records of a
partition a round does not ask for (paused, say) go back: the partition is sought to the first of them, as if
they had never been taken. Everything else runs on the consumer thread's loop: the drain loop reaches it through
:meth:`ReadAhead.take`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from faust.types import TP

__all__ = ["ReadAhead"]

READ_WAIT_S = 1.0  # how long one take waits for records before the reading stops until the next round's ask

# Takes up to ``max_records`` of what was fetched for the partitions (None: all), waiting up to ``timeout`` s for
# some; returns them by partition, in offset order ({} at once while Faust's flow is stopped).
Fetch = Callable[[Collection[TP] | None, float, int], Awaitable[Mapping[Any, list[Any]]]]
# A partition's fetch state (an object a new assignment replaces) and position, or None if it has neither.
Position = Callable[[Any], tuple[object, int] | None]
Seek = Callable[[Any, int], None]  # sets a partition's position (through the seeks the read-ahead is told of)


class _Held:
    __slots__ = ("records", "state", "end")

    def __init__(self, records: list[Any], state: object, end: int) -> None:
        self.records, self.state, self.end = records, state, end


class ReadAhead:
    """The records fetched for a consumer and not yet handed to a round (see the module docstring)."""

    def __init__(self, fetch: Fetch, position: Position, seek: Seek, limit: int, max_records: int) -> None:
        if limit < 0 or max_records < 1:
            raise ValueError(f"need limit >= 0 and max_records >= 1, got {limit} and {max_records}")
        self._fetch, self._position, self._seek = fetch, position, seek
        self.limit = limit  # records held at most (0: none: a round's ask fetches, as aiokafka does)
        self.max_records = max_records  # what a round takes at most without reading ahead
        self._held: dict[Any, _Held] = {}
        self._count = 0  # records held
        self._lock = threading.RLock()  # seeks come from any thread, and from this one while it holds the lock
        self._partitions: frozenset[Any] | None = None  # what the last round asked for
        self._reading: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.dropped = 0  # records dropped because their partition was sought or reassigned after they were taken

    @property
    def held(self) -> int:
        """Records taken from the fetcher and not yet handed on."""
        return self._count

    def sought(self, partitions: Iterable[Any]) -> None:
        """``partitions`` are being sought (from any thread): what is held for them is not what comes next."""
        with self._lock:
            for tp in partitions:
                self._forget(tp)

    async def take(self, partitions: Collection[TP] | None, timeout: float) -> dict[Any, list[Any]]:
        """What was fetched for ``partitions`` (None: all), waiting up to ``timeout`` s for some; then read on."""
        if self.limit == 0:
            return dict(await self._fetch(partitions, timeout, self.max_records))
        asked = frozenset(partitions) if partitions is not None else None
        if asked != self._partitions:
            self._partitions = asked
            if self._reading is not None:
                # Its fetch waits for records of the partitions asked for before: stop it (it has taken nothing
                # yet, or it would not be waiting) and read for these.
                self._reading.cancel()
                self._reading = None
        deadline = time.monotonic() + timeout
        arrived = self._arrived_event()
        started = False
        while True:
            self._raise_error()
            taken = self._hand(partitions)
            if taken:
                self._read_on()
                return taken
            if self._reading is None:
                if started:
                    return taken  # the reading this round started came back with nothing (or the flow stopped)
                self._read_on()
                started = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return taken
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), remaining)

    def close(self) -> None:
        """Stop reading ahead (the consumer is stopping)."""
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def _arrived_event(self) -> asyncio.Event:
        if self._arrived is None:
            self._arrived = asyncio.Event()  # created on the consumer thread's loop, where it is awaited
        return self._arrived

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _read_on(self) -> None:
        if self._reading is None and self._error is None and self._count < self.limit:
            self._reading = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while self._count < self.limit:
                fetched = await self._fetch(self._partitions, READ_WAIT_S, self.limit - self._count)
                if not fetched:
                    break  # nothing came (or the flow stopped): the next round's ask reads on
                self._keep(fetched)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the round that asks next, as the fetch would have raised it there
            self._error = exc
        finally:
            if self._reading is asyncio.current_task():
                self._reading = None
            if self._arrived is not None:
                self._arrived.set()

    def _keep(self, fetched: Mapping[Any, list[Any]]) -> None:
        """Hold what one take returned, as a seek now finds it."""
        with self._lock:
            for tp, records in fetched.items():
                if not records:
                    continue
                now = self._position(tp)
                if now is None or now[1] <= records[-1].offset:
                    # Sought back (from another thread) since these were taken: the position is where the seek's
                    # caller reads on. A seek between the fetch and its take needs nothing: the take is after it.
                    self.dropped += len(records)
                    continue
                state, end = now
                held = self._held.get(tp)
                if held is None or held.state is not state:
                    if held is not None:
                        self._forget(tp)
                    self._held[tp] = _Held(list(records), state, end)
                else:
                    held.records.extend(records)
                    held.end = end
                self._count += len(records)
        if self._arrived is not None:
            self._arrived.set()

    def _hand(self, partitions: Collection[TP] | None) -> dict[Any, list[Any]]:
        """What is held for ``partitions``; what is held for others goes back to the fetcher (sought to)."""
        taken: dict[Any, list[Any]] = {}
        with self._lock:
            for tp in list(self._held):
                held = self._held.pop(tp)
                self._count -= len(held.records)
                now = self._position(tp)
                if now is None or now[0] is not held.state or now[1] != held.end:
                    self.dropped += len(held.records)  # reassigned or sought since: not what comes next
                elif partitions is None or tp in partitions:
                    taken[tp] = held.records
                else:
                    # Not asked for (paused, say): as if never taken, the fetcher reads it again when it is.
                    # Under the lock, so that no seek from another thread comes between.
                    self._seek(tp, held.records[0].offset)
        return taken

    def _forget(self, tp: Any) -> None:
        held = self._held.pop(tp, None)
        if held is not None:
            self._count -= len(held.records)
            self.dropped += len(held.records)

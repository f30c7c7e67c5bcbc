"""The models a worker serves (primary, canary, shadow), each on a boundary of its own, and the swap between them.

:class:`ModelSet` stands where the pipeline used to see one boundary: ``submit_many`` routes each
row by its key (:func:`agents.model.deployment.canary_bucket`) to the primary's or the canary's boundary,
and offers a copy to the shadow's, which takes what fits and never makes the caller wait.

:meth:`ModelSet.apply` moves to a new deployment without a restart: the files it names are read,
hashed, loaded, checked against the feature contract and warmed on the inference sizes off the event
loop; only when all of them are ready does routing switch, in one step on the event loop. A model that
stays in its role keeps its boundary. The boundaries a deployment no longer uses stop taking rows at
the switch and release what they hold: batches already queued or dispatched finish on the model they
started on, and their records are acknowledged as usual. A deployment whose files cannot be used is
rejected as a whole (:class:`Rejection`) and the models serving keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from agents.model.boundary import ModelBoundary
from agents.model.deployment import Deployment, DeploymentError, ModelRef, canary_bucket
from agents.model.runtime import ModelContractError, ModelRuntime
from agents.observe.metrics import BoundaryMetrics, ModelMetrics

__all__ = ["ROLES", "ModelSet", "Rejection", "Served"]

logger = logging.getLogger(__name__)

ROLES = ("primary", "canary", "shadow")


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


class Routed(Protocol):
    """What the models route a row by: its event's key (the pipeline's items, :class:`agents.pipeline.ScoringItem`)."""

    @property
    def tx(self) -> _Keyed: ...


ItemT = TypeVar("ItemT", bound=Routed)
Rows = Sequence[tuple[Sequence[float], ItemT]]
# A loaded model and the role it serves in -> its boundary and its metrics (None when metrics are off).
Serve = Callable[[ModelRuntime, str], tuple[ModelBoundary[ItemT], ModelMetrics | None]]


@dataclass(eq=False)
class Served(Generic[ItemT]):
    """One model serving in one role: its runtime, its boundary and the task dispatching its batches."""

    role: str
    ref: ModelRef
    runtime: ModelRuntime
    boundary: ModelBoundary[ItemT]
    metrics: ModelMetrics | None
    task: asyncio.Task[None] | None = None
    submitting: int = 0  # submit_many calls inside this boundary now (a retirement waits for them)
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def describe(self) -> dict[str, object]:
        info = self.runtime.info
        return {"model": info.tag, "path": self.ref.path, "sha256": self.ref.sha256, "provider": info.provider,
                "waiting": self.boundary.waiting, "stats": self.boundary.stats.as_dict()}


@dataclass(frozen=True, slots=True)
class Rejection:
    """A deployment this worker refused, and why (the models serving before it kept serving)."""

    revision: int | None  # None: the record itself could not be read
    reason: str  # missing_file, sha256_mismatch, not_a_model, contract, invalid_record, load_error
    detail: str
    at_ms: int

    def as_dict(self) -> dict[str, object]:
        return {"revision": self.revision, "reason": self.reason, "detail": self.detail, "at_ms": self.at_ms}


def rejection_reason(error: BaseException) -> str:
    """The short reason of a load failure (a metric label): a file's own (missing, hash, not a model), a broken
    contract, an unreadable record, or ``load_error`` for anything else (a device that fails, a warm-up that raises)."""
    if isinstance(error, DeploymentError):
        return "invalid_record"
    return getattr(error, "reason", "contract" if isinstance(error, ModelContractError) else "load_error")


class ModelSet(Generic[ItemT]):
    """The deployment a worker serves and the routing of rows to its models' boundaries."""

    def __init__(self, load: Callable[[ModelRef], ModelRuntime], serve: Serve[ItemT],
                 on_failure: Callable[[BaseException], None], metrics: BoundaryMetrics | None = None) -> None:
        self._load = load  # blocking: read, hash, open, check and warm (run off the event loop)
        self._serve = serve
        self._on_failure = on_failure
        self._metrics = metrics  # the deployment revision served and the refusals, counted here only
        self._lock = asyncio.Lock()  # one deployment change at a time
        self.deployment: Deployment | None = None
        self.rejected: Rejection | None = None
        self.primary: Served[ItemT] | None = None
        self.canary: Served[ItemT] | None = None
        self.shadow: Served[ItemT] | None = None
        self._canary_buckets = 0
        self._retiring: set[Served[ItemT]] = set()  # no longer routed to, still finishing what they took
        self.swaps = 0

    # The pipeline's side.

    async def submit_many(self, items: Rows[ItemT]) -> None:
        """Hand rows to their models' boundaries; waits while the one a row goes to is full."""
        shadow, canary, primary = self.shadow, self.canary, self.primary
        if primary is None:
            raise RuntimeError("no model is serving yet")
        if shadow is not None:
            taken = shadow.boundary.offer_many(items)
            if taken < len(items) and shadow.metrics is not None:
                shadow.metrics.shadow_dropped.inc(len(items) - taken)
        if canary is None:
            await self._submit(primary, items)
            return
        threshold = self._canary_buckets
        to_primary: list[tuple[Sequence[float], ItemT]] = []
        to_canary: list[tuple[Sequence[float], ItemT]] = []
        for row in items:
            (to_canary if canary_bucket(row[1].tx.key) < threshold else to_primary).append(row)
        if to_primary:
            await self._submit(primary, to_primary)
        if to_canary:
            await self._submit(canary, to_canary)

    async def _submit(self, served: Served[ItemT], items: Rows[ItemT]) -> None:
        served.submitting += 1
        try:
            await served.boundary.submit_many(items)
        finally:
            served.submitting -= 1
            if not served.submitting:
                served.idle.set()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold every boundary rows go to while a fetch is handed over (:meth:`ModelBoundary.holding`)."""
        with contextlib.ExitStack() as stack:
            for served in (self.primary, self.canary, self.shadow):
                if served is not None:
                    stack.enter_context(served.boundary.holding())
            yield

    async def flush(self) -> None:
        """Release every row waiting at the scoring boundaries (those a swap is retiring included) and wait
        until it is delivered."""
        for served in [*self.scoring(), *(s for s in self._retiring if s.role != "shadow")]:
            await served.boundary.flush()

    @property
    def waiting(self) -> int:
        return sum(s.boundary.waiting for s in self.scoring())

    def scoring(self) -> Iterator[Served[ItemT]]:
        """The models whose scores become predictions (primary, then canary)."""
        return (s for s in (self.primary, self.canary) if s is not None)

    def serving(self) -> Iterator[Served[ItemT]]:
        return (s for s in (self.primary, self.canary, self.shadow) if s is not None)

    @property
    def running(self) -> bool:
        """Whether a primary serves and every model served has its boundary dispatching batches."""
        return self.primary is not None and all(
            s.task is not None and not s.task.done() for s in self.serving())

    # Deployments.

    async def start(self, deployment: Deployment, fallback: Deployment | None = None) -> None:
        """Serve ``deployment``; if it is refused, the newest deployment of its history that can serve (what
        the other workers kept serving when they refused it too), else ``fallback``; raises if none can."""
        if await self.apply(deployment):
            return
        rejected = self.rejected
        for earlier in (*deployment.history, *([] if fallback is None else [fallback])):
            if await self.apply(earlier):
                logger.error("serving deployment %s (%s) instead of the control topic's deployment %s",
                             earlier.revision, self.describe_short(), deployment.revision)
                self.rejected = rejected
                return
        raise RuntimeError(f"no deployment can serve: {rejected}")

    def reject(self, revision: int | None, error: BaseException) -> Rejection:
        """Record a deployment (or an unreadable record) refused because of ``error``."""
        rejection = Rejection(revision, rejection_reason(error), str(error), int(time.time() * 1000))
        self.rejected = rejection
        if self._metrics is not None:
            self._metrics.deployment_rejections.labels(rejection.reason).inc()
        logger.error("model deployment %s rejected (%s): %s; still serving %s", revision, rejection.reason,
                     rejection.detail, self.describe_short())
        return rejection

    def _serving(self, deployment: Deployment) -> None:
        self.deployment = deployment
        if self._metrics is not None:
            self._metrics.deployment_revision.set(deployment.revision)

    async def apply(self, deployment: Deployment) -> bool:
        """Switch to ``deployment``; False (and :attr:`rejected` set) if one of its models cannot serve."""
        async with self._lock:
            if deployment.same_models(self.deployment):
                self._serving(deployment)
                return True
            started = time.perf_counter()
            wanted = {"primary": deployment.primary, "canary": deployment.canary, "shadow": deployment.shadow}
            current = {s.role: s for s in self.serving()}
            loaded = {s.ref: s.runtime for s in self.serving()}
            try:
                for ref in wanted.values():
                    if ref is not None and ref not in loaded:
                        loaded[ref] = await asyncio.to_thread(self._load, ref)
            except Exception as exc:  # noqa: BLE001 - whatever a file does to the loader, the serving models stay
                self.reject(deployment.revision, exc)
                return False
            chosen: dict[str, Served[ItemT] | None] = {}
            for role, ref in wanted.items():
                keep = current.get(role)
                if ref is None:
                    chosen[role] = None
                elif keep is not None and keep.ref == ref:
                    chosen[role] = keep
                else:
                    chosen[role] = self._start(role, ref, loaded[ref])
            retired = [s for s in current.values() if chosen.get(s.role) is not s]
            # The switch: from here on every row goes to the new deployment's boundaries.
            self.primary, self.canary, self.shadow = chosen["primary"], chosen["canary"], chosen["shadow"]
            self._canary_buckets = deployment.canary_buckets
            previous = self.deployment
            self._serving(deployment)
            if self.rejected is not None and (self.rejected.revision or 0) < deployment.revision:
                self.rejected = None  # a later deployment serves: the refusal is history
            if previous is not None:
                self.swaps += 1
            switched = time.perf_counter()
            await asyncio.gather(*(self._retire(s) for s in retired))
            logger.info("model deployment %s (%s) serving: %s; loaded in %.2f s, old boundaries released in %.2f s",
                        deployment.revision, deployment.command or "start", self.describe_short(),
                        switched - started, time.perf_counter() - switched)
            return True

    def _start(self, role: str, ref: ModelRef, runtime: ModelRuntime) -> Served[ItemT]:
        boundary, metrics = self._serve(runtime, role)
        served = Served(role, ref, runtime, boundary, metrics)
        served.idle.set()
        served.task = asyncio.ensure_future(boundary.run())
        served.task.add_done_callback(self._dispatch_ended)
        return served

    def _dispatch_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._on_failure(error)

    async def _retire(self, served: Served[ItemT]) -> None:
        """Let a boundary finish what it took (rows waiting, batches dispatched), then stop it."""
        self._retiring.add(served)
        try:
            while served.submitting:
                served.idle.clear()
                await served.idle.wait()
            await served.boundary.flush()
        finally:
            self._retiring.discard(served)
            await self._stop(served)
            if served.metrics is not None:
                served.metrics.retire()

    async def _stop(self, served: Served[ItemT]) -> None:
        task = served.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        served.boundary.close()

    async def close(self) -> None:
        """Stop every boundary (the worker is stopping; what they hold is delivered again after a restart)."""
        for served in [*self.serving(), *self._retiring]:
            await self._stop(served)

    def describe_short(self) -> str:
        parts = []
        for served in self.serving():
            share = f" {self.deployment.canary_percent:g} %" if served.role == "canary" and self.deployment else ""
            parts.append(f"{served.role} {served.runtime.info.tag}{share}")
        return ", ".join(parts) or "nothing"

    def describe(self) -> dict[str, object]:
        """The deployment served, each model in it, and the last deployment refused (for /model/)."""
        deployment = self.deployment
        roles: dict[str, object] = {role: None for role in ROLES}
        for served in self.serving():
            roles[served.role] = served.describe()
        if deployment is not None and deployment.canary is not None and isinstance(roles["canary"], dict):
            roles["canary"]["percent"] = deployment.canary_percent
        return {
            "revision": None if deployment is None else deployment.revision,
            "command": None if deployment is None else deployment.command,
            **roles,
            "rejected": None if self.rejected is None else self.rejected.as_dict(),
        }

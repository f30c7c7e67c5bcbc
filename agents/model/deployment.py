"""Model deployments as data: what a worker should serve, how a command changes it, which key gets which model.

Pure (no Kafka, no ONNX Runtime): :mod:`agents.model.control` reads and writes these records on the compacted
control topic, :mod:`agents.model.models` loads and serves what they name.

A :class:`Deployment` names a **primary** model, optionally a **canary** with the share of keys it
scores, and optionally a **shadow** that scores the same rows off the critical path. Each entry is a
model file and its SHA-256: a worker refuses a file whose bytes hash to something else. Every change
is a new deployment with the next revision; the ones it replaced are kept, newest first, so
``rollback`` returns to the deployment before the current one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "CANARY_BUCKETS",
    "Deployment",
    "DeploymentError",
    "ModelRef",
    "canary_bucket",
    "deploy",
    "file_sha256",
    "initial",
    "promote",
    "rollback",
    "set_shadow",
]

CANARY_BUCKETS = 10_000  # a key's bucket is in [0, 10,000): shares are exact to a hundredth of a percent
HISTORY = 10  # replaced deployments kept for rollback
_CANARY_PERSON = b"seam-canary"  # not the partitioner's hash: a canary share must not follow partitions
_BUCKETS: dict[str, int] = {}  # key -> bucket (keys repeat; a hash costs ~0.6 us)
_BUCKETS_KEPT = 500_000


class DeploymentError(ValueError):
    """A deployment record or command that cannot be used (the message says why)."""


def canary_bucket(key: str) -> int:
    """The key's stable bucket in ``[0, CANARY_BUCKETS)``: the same on every worker, run and version.

    BLAKE2b, not CRC-32: a CRC is linear, and over ids that differ in a few characters ("c-0" ... "c-4999")
    its buckets were not uniform (18.0 % of those keys below a 20 % threshold, against 20.1 % here).
    """
    bucket = _BUCKETS.get(key)
    if bucket is None:
        if len(_BUCKETS) >= _BUCKETS_KEPT:
            _BUCKETS.clear()
        digest = hashlib.blake2b(key.encode(), digest_size=8, person=_CANARY_PERSON).digest()
        bucket = _BUCKETS[key] = int.from_bytes(digest, "big") % CANARY_BUCKETS
    return bucket


def file_sha256(path: Path | str) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A model file as a deployment names it: where every worker finds it, and the hash of its bytes."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: Path | str) -> ModelRef:
        """The reference to a file as it is now (its absolute path and current hash)."""
        resolved = Path(path).resolve()
        if not resolved.is_file():
            raise DeploymentError(f"model file {resolved} does not exist")
        return cls(str(resolved), file_sha256(resolved))

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: Any, role: str) -> ModelRef:
        if not isinstance(data, Mapping):
            raise DeploymentError(f"{role}: expected an object with path and sha256, got {data!r}")
        path, sha = data.get("path"), data.get("sha256")
        if not isinstance(path, str) or not path:
            raise DeploymentError(f"{role}: path must be a non-empty string, got {path!r}")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise DeploymentError(f"{role}: sha256 must be 64 lowercase hex digits, got {sha!r}")
        return cls(path, sha)


@dataclass(frozen=True, slots=True)
class Deployment:
    """The model set every worker converges on."""

    revision: int
    primary: ModelRef
    canary: ModelRef | None = None
    canary_percent: float = 0.0  # of keys, by canary_bucket
    shadow: ModelRef | None = None
    history: tuple[Deployment, ...] = ()  # the deployments this one replaced, newest first
    command: str = ""  # what made it: "deploy", "promote", "rollback" (or "settings" for a worker's default)

    def __post_init__(self) -> None:
        if self.revision < 0:
            raise DeploymentError(f"revision must be >= 0, got {self.revision}")
        if self.canary is None and self.canary_percent:
            raise DeploymentError("a canary share without a canary model")
        if self.canary is not None and not 0 < self.canary_percent < 100:
            raise DeploymentError(f"the canary's share must be between 0 and 100 %, got {self.canary_percent}")

    @property
    def canary_buckets(self) -> int:
        """Keys whose bucket is below this go to the canary."""
        return round(self.canary_percent * CANARY_BUCKETS / 100) if self.canary is not None else 0

    def same_models(self, other: Deployment | None) -> bool:
        """Whether ``other`` serves exactly the same files in the same roles and shares."""
        return other is not None and (self.primary, self.canary, self.canary_buckets, self.shadow) == (
            other.primary, other.canary, other.canary_buckets, other.shadow)

    def as_dict(self, *, with_history: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "revision": self.revision,
            "command": self.command,
            "primary": self.primary.as_dict(),
            "canary": None if self.canary is None else {**self.canary.as_dict(), "percent": self.canary_percent},
            "shadow": None if self.shadow is None else self.shadow.as_dict(),
        }
        if with_history:
            out["history"] = [d.as_dict(with_history=False) for d in self.history]
        return out

    @classmethod
    def from_dict(cls, data: Any, *, nested: bool = False) -> Deployment:
        if not isinstance(data, Mapping):
            raise DeploymentError(f"a deployment must be a JSON object, got {type(data).__name__}")
        revision = data.get("revision")
        if not isinstance(revision, int) or isinstance(revision, bool):
            raise DeploymentError(f"revision must be an integer, got {revision!r}")
        canary_data = data.get("canary")
        canary, percent = None, 0.0
        if canary_data is not None:
            canary = ModelRef.from_dict(canary_data, "canary")
            percent = canary_data.get("percent")
            if not isinstance(percent, int | float) or isinstance(percent, bool):
                raise DeploymentError(f"canary: percent must be a number, got {percent!r}")
        shadow_data = data.get("shadow")
        history_data = [] if nested else data.get("history", [])
        if not isinstance(history_data, list):
            raise DeploymentError("history must be a list")
        command = data.get("command", "")
        return cls(
            revision=revision,
            primary=ModelRef.from_dict(data.get("primary"), "primary"),
            canary=canary,
            canary_percent=float(percent),
            shadow=None if shadow_data is None else ModelRef.from_dict(shadow_data, "shadow"),
            history=tuple(cls.from_dict(d, nested=True) for d in history_data),
            command=command if isinstance(command, str) else "",
        )


def initial(model: ModelRef) -> Deployment:
    """What a worker serves when the control topic holds no deployment: its own ``SEAM_MODEL_PATH``."""
    return Deployment(revision=0, primary=model, command="settings")


def _next(current: Deployment | None, **changes: Any) -> Deployment:
    if current is None:
        if "primary" not in changes:
            raise DeploymentError("there is no deployment yet: deploy a model first")
        return Deployment(revision=1, **changes)
    history = (replace(current, history=()), *current.history)[:HISTORY]
    fields = {"primary": current.primary, "canary": current.canary, "canary_percent": current.canary_percent,
              "shadow": current.shadow} | changes
    return Deployment(revision=current.revision + 1, history=history, **fields)


def deploy(current: Deployment | None, model: ModelRef, *, canary_percent: float | None = None,
           shadow: ModelRef | None = None) -> Deployment:
    """``seam model deploy``: ``model`` as the new primary, or as a canary on ``canary_percent`` of the keys.

    A shadow given here replaces the current one; without one, the current shadow stays. A canary
    deployment needs a primary to compare against and replaces a canary already running.
    """
    changes: dict[str, Any] = {"command": "deploy"}
    if shadow is not None:
        changes["shadow"] = shadow
    if canary_percent is None:
        return _next(current, primary=model, canary=None, canary_percent=0.0, **changes)
    if current is None:
        raise DeploymentError("a canary needs a primary model: deploy one first, then the canary")
    if model == current.primary:
        raise DeploymentError(f"{model.path} is already the primary model")
    return _next(current, canary=model, canary_percent=float(canary_percent), **changes)


def promote(current: Deployment | None) -> Deployment:
    """``seam model promote``: the canary becomes the primary, for every key."""
    if current is None or current.canary is None:
        raise DeploymentError("there is no canary to promote")
    return _next(current, primary=current.canary, canary=None, canary_percent=0.0, command="promote")


def rollback(current: Deployment | None) -> Deployment:
    """``seam model rollback``: undo the last rollout, as a new revision.

    With a canary running, the canary is withdrawn (every key back on the primary). Otherwise the
    primary goes back to the one before it (the most recent earlier deployment with another primary,
    without its canary): after ``deploy --canary`` then ``promote``, a rollback puts every key back
    on the model they started on. Rolling back again goes further back.
    """
    if current is None:
        raise DeploymentError("there is no deployment to roll back")
    if current.canary is not None:
        target = replace(current, canary=None, canary_percent=0.0, history=())
        history = current.history
        if history and history[0].same_models(target):
            history = history[1:]
        return replace(target, revision=current.revision + 1, history=history, command="rollback")
    for index, earlier in enumerate(current.history):
        if earlier.primary != current.primary:
            return Deployment(revision=current.revision + 1, primary=earlier.primary, shadow=earlier.shadow,
                              history=current.history[index + 1:], command="rollback")
    raise DeploymentError("there is no earlier primary model to roll back to")


def set_shadow(current: Deployment | None, shadow: ModelRef | None) -> Deployment:
    """``seam model shadow PATH`` (or ``off``): start, replace or stop the shadow; nothing else changes."""
    if current is None:
        raise DeploymentError("a shadow needs a primary model: deploy one first")
    if shadow == current.shadow:
        raise DeploymentError("that is already the shadow" if shadow is not None else "there is no shadow to stop")
    return _next(current, shadow=shadow, command="shadow")

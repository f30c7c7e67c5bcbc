"""The ONNX Runtime model: device selection, the model contract check, and batch inference.

``ModelRuntime.predict`` is blocking and meant to run on the model boundary's inference thread (ONNX
Runtime releases the GIL while it computes), never on the event loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

__all__ = ["ModelContractError", "ModelFileError", "ModelFiles", "ModelInfo", "ModelRuntime", "DeviceUnavailableError",
           "runtime_package"]

logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def runtime_package() -> str:
    """The ONNX Runtime distribution installed, with its version: ``onnxruntime-gpu 1.31.1`` (CUDA
    builds, Linux and Windows on x86-64) or ``onnxruntime 1.31.1`` (elsewhere, macOS included)."""
    import importlib.metadata

    names = importlib.metadata.packages_distributions().get("onnxruntime") or ["onnxruntime"]
    return f"{names[0]} {ort.__version__}"


class ModelContractError(RuntimeError):
    """The model file does not match what seam feeds it or expects back."""


class ModelFileError(ModelContractError):
    """The model file is missing, unreadable, not a model, or its bytes are not the ones a deployment names."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        # missing_file, outside_model_dir, not_a_file, too_large, read_timeout, sha256_mismatch or not_a_model
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Which files a worker reads as models, and how: the rules a deployment record cannot bend.

    A control record names a path and its hash, so the hash proves integrity, not who wrote it. A worker
    therefore reads only regular files under ``root`` (SEAM_MODEL_DIR; resolved, so neither ``..`` nor a
    link leads out of it) or the one file ``also`` (SEAM_MODEL_PATH), of at most ``max_bytes``, in chunks,
    within ``timeout_s``: never a device, a FIFO or a file that does not end. ``root=None``: anywhere (a
    command run on the operator's own file).
    """

    root: Path | None = None
    also: Path | None = None
    max_bytes: int = 512 << 20
    timeout_s: float = 60.0

    @classmethod
    def under(cls, root: Path, also: Path | None = None, *, max_bytes: int = 512 << 20,
              timeout_s: float = 60.0) -> ModelFiles:
        return cls(root.resolve(), None if also is None else also.resolve(), max_bytes, timeout_s)

    def allowed(self, path: Path | str) -> Path:
        """``path`` resolved, if a deployment may name it; else :class:`ModelFileError` (``outside_model_dir``)."""
        resolved = Path(path).resolve()
        if self.root is None or resolved == self.also or resolved.is_relative_to(self.root):
            return resolved
        raise ModelFileError(f"model file {path} is outside SEAM_MODEL_DIR ({self.root}): a deployment names files "
                             "there only", "outside_model_dir")

    def read(self, path: Path | str) -> bytes:
        """The bytes of an allowed regular file, read in chunks within the size and time bounds."""
        resolved = self.allowed(path)
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(resolved, flags)  # non-blocking: opening a FIFO does not wait for a writer
        except FileNotFoundError:
            raise ModelFileError(f"model file {path} does not exist", "missing_file") from None
        except OSError as exc:
            raise ModelFileError(f"model file {path} cannot be read: {exc.strerror}", "missing_file") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > self.max_bytes:
            os.close(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ModelFileError(f"model file {path} is not a regular file", "not_a_file")
            raise ModelFileError(f"model file {path} is larger than SEAM_MAX_MODEL_MB ({self.max_bytes >> 20} MiB)",
                                 "too_large")
        with os.fdopen(fd, "rb", buffering=0) as handle:
            deadline = time.monotonic() + self.timeout_s
            chunks, total = [], 0
            while chunk := handle.read(1 << 20):
                total += len(chunk)
                if total > self.max_bytes:  # it grew while being read
                    raise ModelFileError(f"model file {path} is larger than SEAM_MAX_MODEL_MB "
                                         f"({self.max_bytes >> 20} MiB)", "too_large")
                if time.monotonic() > deadline:
                    raise ModelFileError(f"model file {path} was not read within {self.timeout_s:g} s", "read_timeout")
                chunks.append(chunk)
        return b"".join(chunks)


class DeviceUnavailableError(RuntimeError):
    """``SEAM_DEVICE=cuda`` was asked for but the session does not run on CUDA."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a worker reports about its model: identity, contract and the provider really in use."""

    name: str
    version: str
    path: str
    provider: str
    feature_names: tuple[str, ...]
    input_name: str
    output_name: str
    sha256: str = ""

    @property
    def tag(self) -> str:
        return f"{self.name}@{self.version}"

def _session(model: Path | bytes, providers: list[str], threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures surface as exceptions, logged by seam with context
    if threads > 0:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # ONNX Runtime's pool threads spin-wait for the next call after each one. That buys a little
    # latency on a core kept for the model alone; in a worker it takes the cores from the event
    # loop and the Kafka client (the default model's 256-row call cost 3.2 ms of CPU spinning
    # against 0.1 ms without).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, sess_options=options, providers=providers)


def open_session(path: Path | bytes, device: str, threads: int = 1) -> ort.InferenceSession:
    """Open a session (from a file or its bytes) on the device policy ``auto``, ``cpu`` or ``cuda`` and
    verify where it runs."""
    ort.set_default_logger_severity(3)
    if device == "cpu":
        return _session(path, [CPU], threads)
    available = ort.get_available_providers()
    if CUDA in available:
        # Probing CUDA on a host without its libraries makes ONNX Runtime print a native error;
        # the outcome is reported below in one line instead.
        ort.set_default_logger_severity(4)
        try:
            session = _session(path, [CUDA, CPU], threads)
        except Exception as exc:  # noqa: BLE001 - a broken CUDA install must not stop `auto`
            if device == "cuda":
                raise DeviceUnavailableError(f"CUDA session could not be created: {exc}") from exc
            session = None
        finally:
            ort.set_default_logger_severity(3)
        # The available list only says the package was built with CUDA; the session's own
        # provider list says what it really runs on.
        if session is not None and session.get_providers()[0] == CUDA:
            return session
    if device == "cuda":
        raise DeviceUnavailableError(
            "SEAM_DEVICE=cuda but ONNX Runtime cannot run on CUDA here "
            f"(available providers {available}); use SEAM_DEVICE=auto or cpu")
    logger.info("CUDA is not active on this host (ONNX Runtime providers: %s); the model runs on CPU",
                available)
    return _session(path, [CPU], threads)


class ModelRuntime:
    """One ONNX Runtime session and the contract it was checked against."""

    def __init__(self, session: ort.InferenceSession, info: ModelInfo) -> None:
        self._session = session
        self.info = info

    @classmethod
    def load(
        cls,
        path: Path | str,
        *,
        feature_names: Sequence[str],
        device: str = "auto",
        threads: int = 1,
        sha256: str | None = None,
        files: ModelFiles | None = None,
    ) -> ModelRuntime:
        """Open the model, check its contract against ``feature_names`` and report the provider.

        The file is read by ``files``' rules (:class:`ModelFiles`; by default a regular file anywhere, of
        at most 512 MiB). With ``sha256`` its bytes must hash to it (a deployment names the file it means):
        they are read once, hashed, and the session is built from those same bytes. A refusal never
        says what the file holds instead: its message is shown on the worker's web views.
        """
        path = Path(path)
        data = (files or ModelFiles()).read(path)
        digest = hashlib.sha256(data).hexdigest()
        if sha256 is not None and digest != sha256:
            raise ModelFileError(f"model file {path} is not the file the deployment names (SHA-256 {sha256})",
                                 "sha256_mismatch")
        try:
            session = open_session(data, device, threads)
        except DeviceUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types for a broken file
            raise ModelFileError(f"model file {path} is not a model ONNX Runtime can load: {exc}",
                                 "not_a_model") from None
        info = _check_contract(session, path, tuple(feature_names), digest)
        logger.info("model %s loaded from %s on %s", info.tag, path, info.provider)
        return cls(session, info)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Score a float32 ``[N, F]`` batch; returns ``N`` scores."""
        outputs = self._session.run([self.info.output_name], {self.info.input_name: features})
        scores = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        if len(scores) != len(features):
            raise ModelContractError(
                f"model returned {len(scores)} scores for a batch of {len(features)} rows")
        return scores

    def warmup(self, batch_sizes: Iterable[int]) -> None:
        """Run each batch size once so first real batches do not pay for allocation."""
        width = len(self.info.feature_names)
        for size in batch_sizes:
            self.predict(np.zeros((size, width), dtype=np.float32))


def _check_contract(session: ort.InferenceSession, path: Path, expected: tuple[str, ...], sha256: str) -> ModelInfo:
    meta = session.get_modelmeta()
    props = meta.custom_metadata_map
    if "feature_names" not in props:
        raise ModelContractError(f"{path}: ONNX metadata has no 'feature_names' entry")
    try:
        names = tuple(json.loads(props["feature_names"]))
    except (ValueError, TypeError) as exc:
        raise ModelContractError(f"{path}: 'feature_names' metadata is not a JSON list: {exc}") from None
    if names != expected:
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        detail = (f"missing {missing}, unexpected {extra}" if missing or extra
                  else f"same names in another order: model {list(names)}, spec {list(expected)}")
        raise ModelContractError(f"{path}: feature_names differ from the feature spec: {detail}")
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1:
        raise ModelContractError(f"{path}: expected one input, found {len(inputs)}")
    (inp,) = inputs
    if inp.type != "tensor(float)":
        raise ModelContractError(f"{path}: input {inp.name!r} is {inp.type}, expected tensor(float)")
    if len(inp.shape) != 2:
        raise ModelContractError(f"{path}: input {inp.name!r} has rank {len(inp.shape)}, expected 2")
    if isinstance(inp.shape[1], int) and inp.shape[1] != len(expected):
        raise ModelContractError(
            f"{path}: input width is {inp.shape[1]}, the feature spec has {len(expected)} features")
    if len(outputs) < 1:
        raise ModelContractError(f"{path}: model has no output")
    out = outputs[0]
    trailing = [d for d in out.shape[1:] if d != 1]
    if trailing:
        raise ModelContractError(f"{path}: output {out.name!r} shape {out.shape} is not one score per row")
    return ModelInfo(
        name=props.get("model_name", path.stem),
        version=props.get("model_version", meta.version and str(meta.version) or "0"),
        path=os.fspath(path),
        provider=session.get_providers()[0],
        feature_names=names,
        input_name=inp.name,
        output_name=out.name,
        sha256=sha256,
    )

"""Unit tests for agents.model.runtime: the committed model, device policy, contract checks, predict."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from agents.model.runtime import (
    DeviceUnavailableError,
    ModelContractError,
    ModelFileError,
    ModelFiles,
    ModelRuntime,
    open_session,
)
from models import EXAMPLE_MODEL
from tables.features import DEFAULT_SPEC
from tests.specs import fraud_like

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "fraud-mlp.onnx"
NAMES = DEFAULT_SPEC.names
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@functools.cache
def cuda_active() -> bool:
    """Whether ONNX Runtime really runs a session on CUDA here (not merely built with it)."""
    if CUDA not in ort.get_available_providers():
        return False
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(str(MODEL), providers=[CUDA, CPU])
    except Exception:  # noqa: BLE001 - a broken CUDA install means: not active
        return False
    finally:
        ort.set_default_logger_severity(3)
    return session.get_providers()[0] == CUDA


@pytest.fixture(scope="module")
def cpu_runtime() -> ModelRuntime:
    """The committed model on CPU, shared by the read-only predict tests."""
    return ModelRuntime.load(MODEL, feature_names=NAMES, device="cpu")


@pytest.fixture
def model_copy(tmp_path: Path) -> Callable[..., Path]:
    """Factory: a copy of the committed model with edited metadata (None removes a key)."""

    def make(name: str = "edited.onnx", **props: str | None) -> Path:
        model = onnx.load(str(MODEL))
        meta = {p.key: p.value for p in model.metadata_props}
        for key, value in props.items():
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        del model.metadata_props[:]
        for key, value in meta.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        path = tmp_path / name
        onnx.save(model, str(path))
        return path

    return make


def features(n: int, seed: int = 0) -> np.ndarray:
    """A plausible float32 [n, 15] batch (counts, amounts, gaps, ratios)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(n, len(NAMES))).astype(np.float32)
    x[:, [0, 4, 8]] = rng.integers(1, 20, size=(n, 3))  # counts
    x[:, [1, 2, 3, 5, 6, 7, 9, 10, 11]] *= 500  # amounts
    x[:, 12] = rng.uniform(-1, 4000, size=n)  # secs_since_prev
    x[:, 13] = rng.integers(1, 6, size=n)  # distinct merchants
    x[:, 14] = rng.uniform(0, 10, size=n)  # amount / mean
    return x


# --- loading --------------------------------------------------------------------------------------


def test_committed_model_loads_on_cpu(cpu_runtime: ModelRuntime) -> None:
    """The committed model matches the default feature spec and runs on CPU."""
    info = cpu_runtime.info
    assert info.provider == CPU
    assert info.tag == "fraud-mlp@1"
    assert (info.name, info.version) == ("fraud-mlp", "1")
    assert info.feature_names == NAMES
    assert info.input_name and info.output_name
    assert Path(info.path) == MODEL


def test_load_accepts_str_path() -> None:
    """A string path works as well as a Path."""
    runtime = ModelRuntime.load(str(MODEL), feature_names=list(NAMES), device="cpu")
    assert runtime.info.feature_names == NAMES


def test_auto_device_uses_cuda_only_when_active() -> None:
    """device="auto" falls back to CPU when CUDA is not really usable (this CPU-only host)."""
    runtime = ModelRuntime.load(MODEL, feature_names=NAMES, device="auto")
    assert runtime.info.provider == (CUDA if cuda_active() else CPU)
    assert runtime.predict(features(3)).shape == (3,)


def test_cuda_device_unavailable_raises() -> None:
    """device="cuda" without a working CUDA session is an error, not a silent CPU fallback."""
    if cuda_active():
        pytest.skip("CUDA is active on this host")
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        ModelRuntime.load(MODEL, feature_names=NAMES, device="cuda")


def test_threads_option_is_accepted() -> None:
    """An explicit intra-op thread count still gives a working session."""
    runtime = ModelRuntime.load(MODEL, feature_names=NAMES, device="cpu", threads=1)
    assert runtime.predict(features(2)).shape == (2,)


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_sessions_never_spin_wait_and_use_one_thread_by_default(threads: int) -> None:
    """ONNX Runtime's pool threads must not spin between calls: they would take the worker's cores."""
    options = open_session(MODEL, "cpu", threads).get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert open_session(MODEL, "cpu").get_session_options().intra_op_num_threads == 1


# --- predict --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 256])
def test_predict_returns_one_probability_per_row(cpu_runtime: ModelRuntime, n: int) -> None:
    """N rows in, N finite float32 scores in [0, 1] out."""
    scores = cpu_runtime.predict(features(n, seed=n))
    assert scores.shape == (n,)
    assert scores.dtype == np.float32
    assert np.isfinite(scores).all()
    assert ((scores >= 0.0) & (scores <= 1.0)).all()


def test_predict_is_deterministic_and_batch_independent(cpu_runtime: ModelRuntime) -> None:
    """A row's score does not depend on the batch around it, and repeats exactly."""
    batch = features(32, seed=5)
    together = cpu_runtime.predict(batch)
    assert np.array_equal(together, cpu_runtime.predict(batch))
    alone = np.array([cpu_runtime.predict(batch[i : i + 1])[0] for i in range(len(batch))])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    reversed_scores = cpu_runtime.predict(np.ascontiguousarray(batch[::-1]))
    np.testing.assert_allclose(together, reversed_scores[::-1], rtol=1e-5, atol=1e-6)


def test_scores_vary_with_input(cpu_runtime: ModelRuntime) -> None:
    """The model is not constant: different feature rows get different scores."""
    scores = cpu_runtime.predict(features(256, seed=9))
    assert float(scores.max() - scores.min()) > 1e-3


def test_warmup_runs_each_size(cpu_runtime: ModelRuntime) -> None:
    """warmup() accepts the batch sizes the service uses and leaves predict working."""
    cpu_runtime.warmup([1, 8, 256])
    assert cpu_runtime.predict(features(4)).shape == (4,)


# --- contract errors ------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    """A missing model file is a contract error naming the path."""
    path = tmp_path / "nope.onnx"
    with pytest.raises(ModelContractError, match="nope.onnx"):
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")


def test_directory_is_not_a_model(tmp_path: Path) -> None:
    """A directory where the file should be is rejected as not a regular file."""
    with pytest.raises(ModelContractError, match="is not a regular file"):
        ModelRuntime.load(tmp_path, feature_names=NAMES, device="cpu")


def test_unedited_copy_loads(model_copy: Callable[..., Path]) -> None:
    """Control: the copy machinery itself produces a loadable model."""
    runtime = ModelRuntime.load(model_copy(), feature_names=NAMES, device="cpu")
    assert runtime.info.tag == "fraud-mlp@1"


def test_feature_names_in_another_order(model_copy: Callable[..., Path]) -> None:
    """Same names, different order: rejected, saying so."""
    swapped = list(NAMES)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    path = model_copy(feature_names=json.dumps(swapped))
    with pytest.raises(ModelContractError, match="another order"):
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")


def test_spec_in_another_order_than_model() -> None:
    """The committed model against a reordered spec is rejected too."""
    reordered = (*NAMES[1:], NAMES[0])
    with pytest.raises(ModelContractError, match="another order"):
        ModelRuntime.load(MODEL, feature_names=reordered, device="cpu")


def test_model_lacks_a_feature_name(model_copy: Callable[..., Path]) -> None:
    """A name the spec has but the model lacks is named as missing."""
    path = model_copy(feature_names=json.dumps([n for n in NAMES if n != "secs_since_prev"]))
    with pytest.raises(ModelContractError, match=r"missing \['secs_since_prev'\]"):
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")


def test_model_has_an_unexpected_feature_name(model_copy: Callable[..., Path]) -> None:
    """A model name the spec does not have is named as unexpected."""
    names = [*NAMES[:-1], "amount_to_median_3600"]
    path = model_copy(feature_names=json.dumps(names))
    with pytest.raises(ModelContractError, match="amount_to_median_3600") as info:
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")
    assert "amount_to_mean_3600" in str(info.value)


def test_spec_lacks_a_feature_name() -> None:
    """A spec without one of the model's names is rejected, naming it as unexpected."""
    spec_names = [n for n in NAMES if n != "count_600"]
    with pytest.raises(ModelContractError, match=r"unexpected \['count_600'\]"):
        ModelRuntime.load(MODEL, feature_names=spec_names, device="cpu")


def test_no_feature_names_metadata(model_copy: Callable[..., Path]) -> None:
    """A model without feature_names metadata is rejected."""
    path = model_copy(feature_names=None)
    with pytest.raises(ModelContractError, match="feature_names"):
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")


@pytest.mark.parametrize("bad", ["not json", '{"a": 1', "42"])
def test_feature_names_metadata_not_a_list(model_copy: Callable[..., Path], bad: str) -> None:
    """Unparseable or non-list feature_names metadata is a contract error, not a crash."""
    path = model_copy(feature_names=bad)
    with pytest.raises(ModelContractError):
        ModelRuntime.load(path, feature_names=NAMES, device="cpu")


def test_input_width_must_match_spec(model_copy: Callable[..., Path]) -> None:
    """Names that agree but a 15-wide input for a 7-feature spec: the width check catches it."""
    spec = fraud_like((60,), 60, 60)
    path = model_copy(feature_names=json.dumps(list(spec.names)))
    with pytest.raises(ModelContractError, match="input width is 15"):
        ModelRuntime.load(path, feature_names=spec.names, device="cpu")


def test_name_and_version_fall_back(model_copy: Callable[..., Path]) -> None:
    """Without model_name/model_version metadata the file stem and a default version are used."""
    path = model_copy("stemmed.onnx", model_name=None, model_version=None)
    info = ModelRuntime.load(path, feature_names=NAMES, device="cpu").info
    assert info.name == "stemmed"
    assert info.tag.startswith("stemmed@")


def test_the_cuda_build_is_asked_for_only_where_it_has_wheels() -> None:
    """onnxruntime-gpu on Linux and Windows x86-64, the CPU build everywhere else (macOS, ARM): exactly one."""
    import tomllib

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    from tests.conftest import ROOT

    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    runtimes = [d for d in deps if d.name.startswith("onnxruntime")]
    expected = {("linux", "x86_64"): "onnxruntime-gpu", ("win32", "AMD64"): "onnxruntime-gpu",
                ("darwin", "arm64"): "onnxruntime", ("darwin", "x86_64"): "onnxruntime",
                ("linux", "aarch64"): "onnxruntime"}
    for (platform, machine), name in expected.items():
        env = dict(default_environment(), sys_platform=platform, platform_machine=machine)
        assert [d.name for d in runtimes if d.marker is None or d.marker.evaluate(env)] == [name], (platform, machine)


def test_the_installed_runtime_package_is_named() -> None:
    from agents.model.runtime import runtime_package

    name, version = runtime_package().split(" ")
    assert name in ("onnxruntime", "onnxruntime-gpu") and version[0].isdigit()


# --- which files a deployment may make a worker read ---------------------------------------------------------


def test_a_deployment_reads_regular_files_under_the_model_dir_only(tmp_path: Path) -> None:
    """A control record names a path: under SEAM_MODEL_DIR or SEAM_MODEL_PATH itself, or nothing. Neither `..`
    nor a link leads out; a device (/dev/zero grew a worker to 23.7 GB), a FIFO (it never ends, and held the
    deployment lock) and a file over the size bound are refused at once, each with its reason."""
    root, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "ok.onnx").write_bytes(b"model bytes")
    (elsewhere / "secret").write_bytes(b"not yours")
    (root / "escape.onnx").symlink_to(elsewhere / "secret")
    (root / "inside.onnx").symlink_to(root / "ok.onnx")
    os.mkfifo(root / "fifo.onnx")
    (root / "big.onnx").write_bytes(b"x" * 2048)
    default = elsewhere / "default.onnx"
    default.write_bytes(b"the worker's own")
    files = ModelFiles.under(root, default, max_bytes=1024, timeout_s=5)

    def reason(path: Path | str) -> str:
        with pytest.raises(ModelFileError) as refused:
            files.read(path)
        return refused.value.reason

    assert files.read(root / "ok.onnx") == b"model bytes" and files.read(root / "inside.onnx") == b"model bytes"
    assert files.read(default) == b"the worker's own"  # SEAM_MODEL_PATH, wherever it is
    assert reason(root / ".." / "elsewhere" / "secret") == "outside_model_dir"
    assert reason(root / "escape.onnx") == "outside_model_dir"
    assert reason("/dev/zero") == "outside_model_dir"
    assert reason(root / "fifo.onnx") == "not_a_file"  # at once: opened without waiting for a writer
    assert reason(root / "big.onnx") == "too_large"
    assert reason(root / "gone.onnx") == "missing_file"
    assert ModelFiles(root=Path("/dev")).allowed("/dev/zero") == Path("/dev/zero")
    with pytest.raises(ModelFileError, match="not a regular file"):
        ModelFiles(root=Path("/dev")).read("/dev/zero")


def test_a_refusal_does_not_say_what_the_file_holds(tmp_path: Path) -> None:
    """A deployment naming a file with another hash is refused without the file's real digest: refusals are
    shown on the web views, and the digest would let anyone who can write the control topic learn it."""
    model = tmp_path / "m.onnx"
    model.write_bytes(EXAMPLE_MODEL.read_bytes())
    real = hashlib.sha256(model.read_bytes()).hexdigest()
    with pytest.raises(ModelFileError) as refused:
        ModelRuntime.load(model, feature_names=DEFAULT_SPEC.names, device="cpu", sha256="f" * 64,
                          files=ModelFiles.under(tmp_path))
    message = str(refused.value)
    assert refused.value.reason == "sha256_mismatch" and real not in message and "f" * 64 in message

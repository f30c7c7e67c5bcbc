"""Unit tests for app.settings: defaults, SEAM_* parsing, validation and immutability."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.settings import Settings, SettingsError, memory_limit

PROPERTY = hsettings(max_examples=60, derandomize=True, database=None, deadline=None)


def test_defaults_topics_and_port() -> None:
    """The documented defaults hold when nothing is set."""
    s = Settings.from_env({})
    assert s.input_topic == "transactions"
    assert s.predictions_topic == "predictions"
    assert s.dlq_topic == "transactions-dlq"
    assert s.late_topic == "transactions-late"
    assert s.web_port == 6066
    assert s.device == "auto"
    assert s.max_batch_size == 256
    assert s.max_wait_ms == 5.0
    assert s.max_inflight_batches == 2
    assert s.feature_spec.name == "fraud.toml" and s.feature_spec.is_file()
    assert s.standby_replicas == 0
    assert s.model_path.name == "fraud-mlp.onnx"
    assert isinstance(s.data_dir, Path)


def test_from_empty_env_equals_constructor_defaults() -> None:
    """from_env({}) builds exactly the dataclass defaults."""
    assert Settings.from_env({}) == Settings()


def test_non_seam_variables_are_ignored() -> None:
    """Variables outside the SEAM_ namespace (even look-alikes) do not matter."""
    s = Settings.from_env({"HOME": "/root", "SEAMLESS": "1", "seam_device": "cuda", "PATH": "/bin"})
    assert s == Settings()


@pytest.mark.parametrize(
    ("name", "text", "field", "expected"),
    [
        ("SEAM_MAX_BATCH_SIZE", "64", "max_batch_size", 64),
        ("SEAM_WEB_PORT", "7070", "web_port", 7070),
        ("SEAM_TOPIC_PARTITIONS", " 3 ", "topic_partitions", 3),
        ("SEAM_MAX_INFLIGHT_BATCHES", "5", "max_inflight_batches", 5),
        ("SEAM_MAX_WAIT_MS", "2.5", "max_wait_ms", 2.5),
        ("SEAM_MAX_WAIT_MS", "0", "max_wait_ms", 0.0),
        ("SEAM_FRAUD_THRESHOLD", "0.75", "fraud_threshold", 0.75),
        ("SEAM_FEATURE_SPEC", "specs/sensors.toml", "feature_spec", Path("specs/sensors.toml")),
        ("SEAM_APP_ID", "seam-test", "app_id", "seam-test"),
        ("SEAM_INPUT_TOPIC", "tx-in", "input_topic", "tx-in"),
        ("SEAM_DEVICE", "cpu", "device", "cpu"),
        ("SEAM_DEVICE", "cuda", "device", "cuda"),
        ("SEAM_MODEL_PATH", "/tmp/m/model.onnx", "model_path", Path("/tmp/m/model.onnx")),
        ("SEAM_DATA_DIR", "relative/dir", "data_dir", Path("relative/dir")),
        ("SEAM_STANDBY_REPLICAS", "1", "standby_replicas", 1),
    ],
)
def test_parses_typed_values(name: str, text: str, field: str, expected: object) -> None:
    """Each variable is parsed to its field's type."""
    s = Settings.from_env({name: text})
    value = getattr(s, field)
    assert value == expected
    assert type(value) is type(expected) or isinstance(value, Path)


def test_path_fields_are_paths() -> None:
    """Path fields come back as Path objects, not strings."""
    s = Settings.from_env({"SEAM_MODEL_PATH": "x/y.onnx", "SEAM_DATA_DIR": "/var/seam"})
    assert isinstance(s.model_path, Path)
    assert isinstance(s.data_dir, Path)
    assert s.data_dir == Path("/var/seam")


def test_several_variables_at_once() -> None:
    """Variables combine; untouched fields keep their defaults."""
    s = Settings.from_env(
        {"SEAM_MAX_BATCH_SIZE": "8", "SEAM_MAX_WAIT_MS": "1.5", "SEAM_DEVICE": "cpu"}
    )
    assert (s.max_batch_size, s.max_wait_ms, s.device) == (8, 1.5, "cpu")
    assert s.web_port == 6066


def test_reads_os_environ_when_no_mapping_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """from_env() without a mapping reads os.environ."""
    import os

    for key in [k for k in os.environ if k.startswith("SEAM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SEAM_WEB_PORT", "9123")
    assert Settings.from_env().web_port == 9123


def test_unknown_seam_variable_is_named() -> None:
    """A misspelt SEAM_ name is an error naming it."""
    with pytest.raises(SettingsError, match="SEAM_MAX_BATCH\\b"):
        Settings.from_env({"SEAM_MAX_BATCH": "10"})


def test_a_setting_that_moved_says_where_it_went() -> None:
    """SEAM_ALLOWED_LATENESS_S is declared by the feature spec now: the refusal says so."""
    with pytest.raises(SettingsError, match=r"SEAM_ALLOWED_LATENESS_S is now allowed_lateness in the feature spec"):
        Settings.from_env({"SEAM_ALLOWED_LATENESS_S": "30"})


def test_all_unknown_variables_are_named() -> None:
    """Every unknown SEAM_ name is reported, not only the first."""
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SEAM_ZZZ": "1", "SEAM_AAA": "2", "SEAM_WEB_PORT": "1"})
    message = str(info.value)
    assert "SEAM_ZZZ" in message
    assert "SEAM_AAA" in message


def test_settings_error_is_a_value_error() -> None:
    """SettingsError subclasses ValueError, so generic handlers catch it."""
    assert issubclass(SettingsError, ValueError)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("SEAM_MAX_BATCH_SIZE", "0"),
        ("SEAM_MAX_BATCH_SIZE", "-3"),
        ("SEAM_MAX_BATCH_SIZE", "abc"),
        ("SEAM_MAX_BATCH_SIZE", "2.5"),
        ("SEAM_DEVICE", "tpu"),
        ("SEAM_MAX_WAIT_MS", "abc"),
        ("SEAM_MAX_WAIT_MS", "-1"),
        ("SEAM_MAX_WAIT_MS", ""),
        ("SEAM_MAX_INFLIGHT_BATCHES", "0"),
        ("SEAM_INFERENCE_THREADS", "-1"),
        ("SEAM_FRAUD_THRESHOLD", "1.5"),
        ("SEAM_FRAUD_THRESHOLD", "-0.1"),
        ("SEAM_FRAUD_THRESHOLD", "nan"),
        ("SEAM_TOPIC_PARTITIONS", "0"),
        ("SEAM_MAX_RECORD_BYTES", "0"),
        ("SEAM_MAX_FUTURE_S", "-1"),
        ("SEAM_MAX_PAST_S", "-5"),
        ("SEAM_WEB_PORT", "http"),
        ("SEAM_STANDBY_REPLICAS", "-1"),
        ("SEAM_INPUT_FORMAT", "protobuf"),
        ("SEAM_INPUT_FORMAT", "avro"),  # without SEAM_SCHEMA_REGISTRY_URL
        ("SEAM_SCHEMA_REGISTRY_TIMEOUT_S", "0"),
        ("SEAM_STATE_CACHE_MB", "-1"),
        ("SEAM_STATE_DB_MEMORY_MB", "7"),  # a memtable is an eighth of it: at least 1 MB
    ],
)
def test_bad_values_name_the_variable(name: str, text: str) -> None:
    """A value seam cannot use raises SettingsError naming the variable."""
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: text})


@pytest.mark.parametrize(
    ("name", "text"),
    [
        # max_wait_ms=nan slips past `< 0`: Batcher.ready() is then never true by age while
        # ModelBoundary.run() dispatches at once (`clock() < nan` is False).
        ("SEAM_MAX_WAIT_MS", "nan"),
        ("SEAM_SLA_MS", "inf"),
    ],
)
def test_non_finite_values_are_rejected(name: str, text: str) -> None:
    """Non-finite numbers are values seam cannot use: SettingsError naming the variable."""
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: text})


def test_constructor_validates_too() -> None:
    """Direct construction runs the same validation."""
    with pytest.raises(SettingsError, match="SEAM_MAX_BATCH_SIZE"):
        Settings(max_batch_size=0)
    with pytest.raises(SettingsError, match="SEAM_DEVICE"):
        Settings(device="tpu")


def test_settings_are_frozen() -> None:
    """Assigning a field fails."""
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_batch_size = 1  # type: ignore[misc]
    assert s.max_batch_size == 256


def test_settings_have_no_instance_dict() -> None:
    """Slots: no new attributes can be attached either."""
    s = Settings()
    with pytest.raises((AttributeError, TypeError)):
        s.extra = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("kafka://127.0.0.1:9092", "127.0.0.1:9092"),
        ("broker:9092", "broker:9092"),
        ("kafka://a:1;kafka://b:2", "a:1,b:2"),
        ("kafka://a:1;b:2", "a:1,b:2"),
    ],
)
def test_broker_bootstrap_strips_scheme(url: str, expected: str) -> None:
    """broker_bootstrap drops kafka:// and joins several brokers with commas."""
    assert Settings.from_env({"SEAM_BROKER_URL": url}).broker_bootstrap == expected


def test_default_broker_bootstrap() -> None:
    """The default broker URL becomes a plain host:port."""
    assert Settings().broker_bootstrap == "127.0.0.1:9092"


@PROPERTY
@given(st.integers(min_value=1, max_value=10**9))
def test_any_positive_batch_size_round_trips(size: int) -> None:
    """Every positive integer text parses back to the same batch size."""
    assert Settings.from_env({"SEAM_MAX_BATCH_SIZE": str(size)}).max_batch_size == size


@PROPERTY
@given(st.integers(max_value=0))
def test_any_non_positive_batch_size_is_rejected(size: int) -> None:
    """Every integer below 1 is rejected with the variable's name."""
    with pytest.raises(SettingsError, match="SEAM_MAX_BATCH_SIZE"):
        Settings.from_env({"SEAM_MAX_BATCH_SIZE": str(size)})


def test_processing_guarantee_defaults_to_at_least_once_and_accepts_exactly_once() -> None:
    assert Settings.from_env({}).processing_guarantee == "at_least_once"
    assert Settings.from_env({"SEAM_PROCESSING_GUARANTEE": "exactly_once"}).processing_guarantee == "exactly_once"
    with pytest.raises(SettingsError, match="SEAM_PROCESSING_GUARANTEE"):
        Settings.from_env({"SEAM_PROCESSING_GUARANTEE": "at_most_once"})


def test_exactly_once_needs_batch_ingestion() -> None:
    with pytest.raises(SettingsError, match="SEAM_INGEST=batch"):
        Settings.from_env({"SEAM_PROCESSING_GUARANTEE": "exactly_once", "SEAM_INGEST": "stream"})


def _seam(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SEAM_")} | env
    return subprocess.run([sys.executable, "-m", "app", *args], env=clean, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])


# Run in a fresh interpreter (this one imported seam long ago): os.environ becomes a mapping that notes each access
# from seam's own packages and each SEAM_* name asked for by anyone (a library copying the whole environment, as
# ``dict(os.environ)`` does, is not asking for one), then the modules are imported.
_WATCH_IMPORTS = r"""
import importlib, json, os, sys
from collections.abc import MutableMapping

root = sys.argv[1]
own = tuple(os.path.join(root, package) + os.sep for package in ("app", "agents", "tables"))
plumbing = {os.__file__, "<frozen os>", __import__("_collections_abc").__file__, "<frozen _collections_abc>"}
accesses = []
copying = []  # frames that iterated over the environment: their reads that follow are a copy


class Watched(MutableMapping):
    def __init__(self, real):
        self._real = real

    def _note(self, what, key=None):
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename in plumbing:
            frame = frame.f_back
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        named = isinstance(key, str) and key.startswith("SEAM_") and not any(f is frame for f in copying)
        if where.startswith(own) or named:
            accesses.append(f"{what} at {where}")
        return frame

    def __getitem__(self, key):
        self._note(f"read {key!r}", key)
        return self._real[key]

    def __contains__(self, key):
        self._note(f"looked for {key!r}", key)
        return key in self._real

    def __iter__(self):
        copying.append(self._note("iterated over the environment"))
        return iter(self._real)

    def __len__(self):
        return len(self._real)

    def __setitem__(self, key, value):
        self._note(f"set {key!r}", key)
        self._real[key] = value

    def __delitem__(self, key):
        self._note(f"deleted {key!r}", key)
        del self._real[key]

    def copy(self):
        copying.append(self._note("copied the environment"))
        return dict(self._real)


assert not [m for m in sys.modules if m.split(".")[0] in ("app", "agents", "tables")], "seam imported already"
os.environ = Watched(os.environ)
os.getenv("SEAM_WATCH_CANARY")  # the watch works: this read is noted
assert len(accesses) == 1 and "SEAM_WATCH_CANARY" in accesses[0], accesses
accesses.clear()
for name in sys.argv[2:]:
    importlib.import_module(name)
print(json.dumps(accesses))
"""


def test_importing_seam_reads_no_environment() -> None:
    """Modules build nothing at import: a bad variable matters only to the command that reads it."""
    root = Path(__file__).resolve().parents[2]
    modules = ("app.main", "app.views", "app.cli", "app.scoring", "tables.state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAM_")} | {"SEAM_NOT_A_SETTING": "1"}
    child = subprocess.run([sys.executable, "-c", _WATCH_IMPORTS, str(root), *modules], env=env, cwd=root,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    accesses = json.loads(child.stdout.splitlines()[-1])
    assert not accesses, f"importing seam touched the environment: {accesses}"


def test_help_works_with_a_bad_variable_and_the_worker_names_it() -> None:
    helped = _seam("--help", SEAM_NOT_A_SETTING="1")
    assert helped.returncode == 0 and "worker" in helped.stdout, helped.stderr
    refused = _seam("worker", SEAM_MAX_BATCH_SIZE="many")
    assert refused.returncode != 0
    assert "SEAM_MAX_BATCH_SIZE='many'" in refused.stderr, refused.stderr


def test_avro_input_needs_a_registry() -> None:
    settings = Settings.from_env({"SEAM_INPUT_FORMAT": "avro",
                                  "SEAM_SCHEMA_REGISTRY_URL": "http://127.0.0.1:8081/apis/ccompat/v6"})
    assert settings.input_format == "avro" and settings.schema_registry_timeout_s == 5.0
    assert Settings().input_format == "json"


# --- the state cache's bound, from the memory the worker may use -------------------------------------------------

GiB = 1 << 30


def _proc(tmp_path: Path, *, cgroup: str, mountinfo: str, total_kb: int = 16 * 1024 * 1024) -> Path:
    """A /proc of ``total_kb`` of physical memory whose process belongs to ``cgroup``, with ``mountinfo``."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal:       {total_kb} kB\nMemFree:        1024 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo.replace("@", str(tmp_path)))
    return proc


def _limit(folder: Path, name: str, value: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(value + "\n")


def test_memory_limit_is_the_hosts_without_a_cgroup_limit(tmp_path: Path) -> None:
    proc = _proc(tmp_path, cgroup="0::/user.slice\n",
                 mountinfo="41 31 0:38 / @/unified rw,relatime - cgroup2 cgroup2 rw\n")
    _limit(tmp_path / "unified" / "user.slice", "memory.max", "max")
    assert memory_limit(proc) == 16 * GiB


def test_memory_limit_is_the_lowest_v2_limit_of_the_cgroup_and_its_parents(tmp_path: Path) -> None:
    proc = _proc(tmp_path, cgroup="0::/kubepods/pod1/worker\n",
                 mountinfo="30 23 0:26 / @/cg rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    _limit(tmp_path / "cg" / "kubepods" / "pod1" / "worker", "memory.max", "max")
    _limit(tmp_path / "cg" / "kubepods" / "pod1", "memory.max", str(2 * GiB))
    _limit(tmp_path / "cg" / "kubepods", "memory.max", str(8 * GiB))
    assert memory_limit(proc) == 2 * GiB


def test_memory_limit_reads_v1_beside_other_controllers(tmp_path: Path) -> None:
    """cgroup v1 (each controller its own mount), its unlimited value a huge number; a v2 mount beside it."""
    proc = _proc(tmp_path, cgroup="5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
                 mountinfo="32 31 0:29 / @/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
                           "35 31 0:32 / @/memory rw,relatime - cgroup cgroup rw,memory\n"
                           "41 31 0:38 / @/unified rw,relatime - cgroup2 cgroup2 rw\n")
    _limit(tmp_path / "memory", "memory.limit_in_bytes", "9223372036854771712")
    _limit(tmp_path / "memory" / "docker" / "abc", "memory.limit_in_bytes", str(512 << 20))
    _limit(tmp_path / "cpu" / "docker" / "abc", "memory.limit_in_bytes", "1")  # not a memory hierarchy
    assert memory_limit(proc) == 512 << 20


def test_memory_limit_in_a_container_reads_its_own_mount(tmp_path: Path) -> None:
    """Without a cgroup namespace a container's /proc/self/cgroup names the host's path, which is not mounted
    there: the limit is the one at the mount point (the container's own cgroup)."""
    proc = _proc(tmp_path, cgroup="0::/system.slice/docker-abc.scope\n",
                 mountinfo="30 23 0:26 /system.slice/docker-abc.scope @/cg ro - cgroup2 cgroup2 rw\n")
    _limit(tmp_path / "cg", "memory.max", str(GiB))
    assert memory_limit(proc) == GiB
    other = _proc(tmp_path / "other", cgroup="0::/system.slice/docker-abc.scope\n",
                  mountinfo="30 23 0:26 / @/cg ro - cgroup2 cgroup2 rw\n")
    _limit(tmp_path / "other" / "cg", "memory.max", str(3 * GiB))  # its host path is not there
    assert memory_limit(other) == 3 * GiB


def test_memory_limit_without_cgroups_is_the_hosts(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:        4096 kB\n")
    assert memory_limit(proc) == 4 << 20


def test_memory_limit_without_proc_is_the_physical_memory(tmp_path: Path) -> None:
    assert memory_limit(tmp_path / "no-proc") == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_state_cache_is_a_quarter_of_the_workers_memory_unless_set() -> None:
    assert Settings.from_env({}).state_cache_bytes == memory_limit() // 4
    assert Settings.from_env({"SEAM_STATE_CACHE_MB": "48"}).state_cache_bytes == 48 << 20

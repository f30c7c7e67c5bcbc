"""seam's settings: one frozen object, read from ``SEAM_*`` environment variables once."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from models import EXAMPLE_MODEL
from specs import EXAMPLE_SPEC
from tables.kafka import PROTOCOLS, SASL_MECHANISMS, Connection

__all__ = ["MOVED", "SECRETS", "Settings", "SettingsError", "memory_limit"]

# Settings that left the environment, and where they are now.
MOVED = {"SEAM_ALLOWED_LATENESS_S": "allowed_lateness in the feature spec (SEAM_FEATURE_SPEC, specs/fraud.toml by "
                                    "default)"}


# Settings that are secrets: each can also be read from a file, SEAM_<NAME>_FILE (as Docker and Kubernetes
# mount secrets), and none appears in the settings' repr, a log line or an error message.
SECRETS = ("sasl_password", "ssl_key_password", "schema_registry_password")


class SettingsError(ValueError):
    """A ``SEAM_*`` variable has a value seam cannot use."""


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected true/false, got {text!r}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a worker needs; each field maps to ``SEAM_<FIELD NAME IN UPPER CASE>``."""

    # Kafka.
    broker_url: str = "kafka://127.0.0.1:9092"
    app_id: str = "seam"
    input_topic: str = "transactions"
    predictions_topic: str = "predictions"
    dlq_topic: str = "transactions-dlq"
    late_topic: str = "transactions-late"
    # Each prediction's point-in-time features, for retraining; empty turns the feature log off.
    feature_log_topic: str = "features"
    # The deployment every worker serves (seam model deploy/promote/rollback write it): compacted, one partition.
    model_control_topic: str = "model-deployments"
    # The shadow model's scores (id, card, model, score), when a deployment has a shadow.
    shadow_topic: str = "predictions-shadow"
    # A secured cluster: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, for every Kafka client seam makes.
    security_protocol: str = "PLAINTEXT"
    # SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, with this user and password (or SEAM_SASL_PASSWORD_FILE).
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    # SSL, SASL_SSL: the CA that signed the brokers' certificates (empty: the system's); for mutual TLS,
    # the client's certificate and key (and the key's password, or SEAM_SSL_KEY_PASSWORD_FILE).
    ssl_ca_file: str = ""
    ssl_cert_file: str = ""
    ssl_key_file: str = ""
    ssl_key_password: str = field(default="", repr=False)
    topic_partitions: int = 8
    topic_replication_factor: int = 1
    max_poll_records: int = 2000
    # Offsets (and the state cache's changelog writes) are committed this often: after a crash, at
    # most about this much input is processed again.
    commit_interval_s: float = 1.0
    # At least once: changed card state is written behind this often, so a commit has little left.
    state_write_interval_s: float = 0.25
    # How long the group waits for a silent worker (killed, partitioned) before moving its partitions.
    session_timeout_s: float = 10.0
    # A fetch waits up to fetch_max_wait_ms for fetch_min_bytes of new records: fewer, larger
    # batches under load (less per-batch work) for at most that much added latency. As the event loop
    # gets busy the wait grows up to fetch_max_wait_busy_ms (agents/ingest/pacing.py; not above
    # fetch_max_wait_ms: a fixed wait).
    fetch_min_bytes: int = 32 * 1024
    fetch_max_wait_ms: int = 10
    fetch_max_wait_busy_ms: int = 30
    # batch: per-partition lists beneath Faust's per-event path; stream: a plain Faust agent.
    ingest: str = "batch"
    # at_least_once: after a crash some outputs are produced again (consumers de-duplicate by id);
    # exactly_once: outputs, state changes and offsets commit in Kafka transactions (read_committed).
    processing_guarantee: str = "at_least_once"
    # Worker.
    # State lives in the worker's working directory unless told otherwise, never inside the installed package.
    data_dir: Path = field(default_factory=lambda: Path.cwd() / ".data")
    web_port: int = 6066
    web_bind: str = "127.0.0.1"
    # The host name other workers use to reach this one (routed table queries); empty: this
    # machine's host name.
    web_host: str = "127.0.0.1"
    # Faust's own pages (/router/: every worker's URL and partitions; /table/: the tables' contents): off.
    web_faust_pages: bool = False
    # false: no per-record or per-batch metrics (pipeline and boundary); /metrics keeps the lag,
    # state, commit and event-loop metrics. For measuring what the metrics cost.
    metrics: bool = True
    # text: Faust's log lines; json: one JSON object per line (time, level, logger, message, error).
    log_format: str = "text"
    # Model boundary.
    model_path: Path = EXAMPLE_MODEL
    # Deployments (the control topic's records) name model files in this folder only, or SEAM_MODEL_PATH
    # itself; empty: SEAM_MODEL_PATH's folder. Whoever can write the control topic chooses the file.
    model_dir: str = ""
    # The largest model file a worker reads.
    max_model_mb: int = 512
    device: str = "auto"
    max_batch_size: int = 256
    max_wait_ms: float = 5.0
    max_inflight_batches: int = 2
    # The boundary's own latency budget per item: queueing plus inference.
    sla_ms: float = 50.0
    adaptive_batching: bool = True
    # ONNX Runtime's intra-op threads per inference call (0: one per core). One: the worker already
    # runs its event loop, Kafka client and inference thread on these cores, and scales by replicas.
    inference_threads: int = 1
    fraud_threshold: float = 0.5
    # The feature spec (a TOML file: tables.spec): the input's fields, the allowed lateness, the features.
    feature_spec: Path = EXAMPLE_SPEC
    # Memory for the card states kept beyond what is being changed (the rest is read back from
    # RocksDB): about 1 KB per card plus 58 bytes per event held (318 while a busy card keeps a window index).
    # 0: a quarter of the memory this worker may use (its cgroup's limit, else the host's): state_cache_bytes.
    state_cache_mb: int = 0
    # RocksDB's own memory, all the table partitions this worker opens together (active and standby): one
    # block cache (blocks read back from disk) charged for the memtables too, which are kept under half of it.
    state_db_memory_mb: int = 64
    # Input records with a larger value go to the dead-letter topic as too_large.
    max_record_bytes: int = 64 * 1024
    # An input record whose event time is more than this ahead of its Kafka timestamp goes to the dead-letter
    # topic as future_timestamp and moves no watermark: clock skew passes, a wrong clock or unit does not (one
    # such record would make every later event of its partition late). 0: no bound.
    max_future_s: float = 300.0
    # ... more than this behind it: past_timestamp. 0 (the default): no bound, so a backfill of history passes.
    max_past_s: float = 0.0
    # json: JSON objects in and out. avro: Confluent-framed Avro in (writer schemas by id from the registry),
    # predictions, feature log and shadow scores out in Avro, their schemas registered as <topic>-value.
    input_format: str = "json"
    # The registry's Confluent-compatible API (Apicurio: http://host:8080/apis/ccompat/v6); needed for avro.
    schema_registry_url: str = ""
    # The longest a batch waits for the registry to return a schema it has not cached; records of a schema it
    # could not get go to the dead-letter topic (registry_unavailable), and the id is asked for again 5 s later.
    schema_registry_timeout_s: float = 5.0
    # The registry's basic auth (the password, or SEAM_SCHEMA_REGISTRY_PASSWORD_FILE) and the CA of its certificate.
    schema_registry_username: str = ""
    schema_registry_password: str = field(default="", repr=False)
    schema_registry_ca_file: str = ""
    # Scaling: warm copies of each table partition kept on other workers (Faust's standby replicas),
    # so a worker taking over a partition reads only the changelog's tail instead of all of it.
    standby_replicas: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(f"SEAM_{f.name.upper()} must be a finite number, got {value}")
        if self.max_batch_size < 1:
            raise SettingsError(f"SEAM_MAX_BATCH_SIZE must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise SettingsError(f"SEAM_MAX_WAIT_MS must be >= 0, got {self.max_wait_ms}")
        if self.max_inflight_batches < 1:
            raise SettingsError(
                f"SEAM_MAX_INFLIGHT_BATCHES must be >= 1, got {self.max_inflight_batches}")
        if self.inference_threads < 0:
            raise SettingsError(f"SEAM_INFERENCE_THREADS must be >= 0, got {self.inference_threads}")
        if not self.model_control_topic or not self.shadow_topic:
            raise SettingsError("SEAM_MODEL_CONTROL_TOPIC and SEAM_SHADOW_TOPIC must not be empty")
        if self.log_format not in {"text", "json"}:
            raise SettingsError(f"SEAM_LOG_FORMAT must be text or json, got {self.log_format!r}")
        if self.ingest not in {"batch", "stream"}:
            raise SettingsError(f"SEAM_INGEST must be batch or stream, got {self.ingest!r}")
        if self.processing_guarantee not in {"at_least_once", "exactly_once"}:
            raise SettingsError("SEAM_PROCESSING_GUARANTEE must be at_least_once or exactly_once, "
                                f"got {self.processing_guarantee!r}")
        if self.processing_guarantee == "exactly_once" and self.ingest != "batch":
            raise SettingsError("SEAM_PROCESSING_GUARANTEE=exactly_once needs SEAM_INGEST=batch")
        if self.sla_ms <= 0:
            raise SettingsError(f"SEAM_SLA_MS must be > 0, got {self.sla_ms}")
        if self.device not in {"auto", "cpu", "cuda"}:
            raise SettingsError(f"SEAM_DEVICE must be auto, cpu or cuda, got {self.device!r}")
        if not 0.0 <= self.fraud_threshold <= 1.0:
            raise SettingsError(f"SEAM_FRAUD_THRESHOLD must be in [0, 1], got {self.fraud_threshold}")
        if self.state_write_interval_s <= 0:
            raise SettingsError(f"SEAM_STATE_WRITE_INTERVAL_S must be > 0, got {self.state_write_interval_s}")
        if self.commit_interval_s <= 0:
            raise SettingsError(f"SEAM_COMMIT_INTERVAL_S must be > 0, got {self.commit_interval_s}")
        if self.fetch_min_bytes < 1:
            raise SettingsError(f"SEAM_FETCH_MIN_BYTES must be >= 1, got {self.fetch_min_bytes}")
        if self.fetch_max_wait_ms < 0:
            raise SettingsError(f"SEAM_FETCH_MAX_WAIT_MS must be >= 0, got {self.fetch_max_wait_ms}")
        if self.fetch_max_wait_busy_ms < 0:
            raise SettingsError(f"SEAM_FETCH_MAX_WAIT_BUSY_MS must be >= 0, got {self.fetch_max_wait_busy_ms}")
        if self.session_timeout_s < 1:
            raise SettingsError(f"SEAM_SESSION_TIMEOUT_S must be >= 1, got {self.session_timeout_s}")
        if self.topic_partitions < 1:
            raise SettingsError(f"SEAM_TOPIC_PARTITIONS must be >= 1, got {self.topic_partitions}")
        if self.max_record_bytes < 1:
            raise SettingsError(f"SEAM_MAX_RECORD_BYTES must be >= 1, got {self.max_record_bytes}")
        if self.max_future_s < 0 or self.max_past_s < 0:
            raise SettingsError(f"SEAM_MAX_FUTURE_S and SEAM_MAX_PAST_S must be >= 0 (0: no bound), got "
                                f"{self.max_future_s} and {self.max_past_s}")
        if self.max_model_mb < 1:
            raise SettingsError(f"SEAM_MAX_MODEL_MB must be >= 1, got {self.max_model_mb}")
        if self.state_cache_mb < 0:
            raise SettingsError(f"SEAM_STATE_CACHE_MB must be >= 0 (0: a quarter of the worker's memory), got "
                                f"{self.state_cache_mb}")
        if self.state_db_memory_mb < 8:
            raise SettingsError(f"SEAM_STATE_DB_MEMORY_MB must be >= 8, got {self.state_db_memory_mb}")
        if self.input_format not in {"json", "avro"}:
            raise SettingsError(f"SEAM_INPUT_FORMAT must be json or avro, got {self.input_format!r}")
        if self.input_format == "avro" and not self.schema_registry_url:
            raise SettingsError("SEAM_INPUT_FORMAT=avro needs SEAM_SCHEMA_REGISTRY_URL (the registry's "
                                "Confluent-compatible API, e.g. http://127.0.0.1:8081/apis/ccompat/v6)")
        if self.schema_registry_timeout_s <= 0:
            raise SettingsError(f"SEAM_SCHEMA_REGISTRY_TIMEOUT_S must be > 0, got {self.schema_registry_timeout_s}")
        if self.standby_replicas < 0:
            raise SettingsError(f"SEAM_STANDBY_REPLICAS must be >= 0, got {self.standby_replicas}")
        if self.security_protocol not in PROTOCOLS:
            raise SettingsError(f"SEAM_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}, "
                                f"got {self.security_protocol!r}")
        if self.security_protocol.startswith("SASL_"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise SettingsError(f"SEAM_SECURITY_PROTOCOL={self.security_protocol} needs SEAM_SASL_MECHANISM, one "
                                    f"of {', '.join(SASL_MECHANISMS)}; got {self.sasl_mechanism!r}")
            if not self.sasl_username or not self.sasl_password:
                raise SettingsError(f"SEAM_SECURITY_PROTOCOL={self.security_protocol} needs SEAM_SASL_USERNAME and "
                                    "SEAM_SASL_PASSWORD (or SEAM_SASL_PASSWORD_FILE)")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise SettingsError(f"SEAM_SASL_* are set but SEAM_SECURITY_PROTOCOL={self.security_protocol} uses no "
                                "SASL (SASL_PLAINTEXT or SASL_SSL does)")
        if bool(self.ssl_cert_file) != bool(self.ssl_key_file):
            raise SettingsError("mutual TLS needs both SEAM_SSL_CERT_FILE and SEAM_SSL_KEY_FILE")
        files = {"SEAM_SSL_CA_FILE": self.ssl_ca_file, "SEAM_SSL_CERT_FILE": self.ssl_cert_file,
                 "SEAM_SSL_KEY_FILE": self.ssl_key_file, "SEAM_SCHEMA_REGISTRY_CA_FILE": self.schema_registry_ca_file}
        for name, path in files.items():
            if path and not Path(path).is_file():
                raise SettingsError(f"{name}: no such file {path!r}")
        if bool(self.schema_registry_username) != bool(self.schema_registry_password):
            raise SettingsError("the registry's basic auth needs both SEAM_SCHEMA_REGISTRY_USERNAME and "
                                "SEAM_SCHEMA_REGISTRY_PASSWORD (or SEAM_SCHEMA_REGISTRY_PASSWORD_FILE)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``SEAM_*`` variables; unknown ``SEAM_*`` names are an error."""
        env = os.environ if env is None else env
        parsers: dict[str, Callable[[str], Any]] = {
            "int": int, "float": float, "str": str, "Path": Path, "bool": _bool,
        }
        known = {f"SEAM_{f.name.upper()}": f for f in fields(cls)}
        secret_files = {f"SEAM_{name.upper()}_FILE": name for name in SECRETS}
        unknown = sorted(k for k in env if k.startswith("SEAM_") and k not in known and k not in secret_files)
        moved = [f"{name} is now {MOVED[name]}" for name in unknown if name in MOVED]
        if moved:
            raise SettingsError("; ".join(moved))
        if unknown:
            raise SettingsError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join([*known, *secret_files])}")
        values: dict[str, Any] = {}
        for name, secret in secret_files.items():
            if name in env:
                if f"SEAM_{secret.upper()}" in env:
                    raise SettingsError(f"set SEAM_{secret.upper()} or {name}, not both")
                try:
                    values[secret] = Path(env[name]).read_text().rstrip("\r\n")
                except OSError as exc:
                    raise SettingsError(f"{name}: cannot read {env[name]!r} ({exc.strerror})") from None
        for name, f in known.items():
            if name in env:
                try:
                    values[f.name] = parsers[str(f.type)](env[name])
                except ValueError as exc:
                    raise SettingsError(f"{name}={env[name]!r}: {exc}") from None
        return cls(**values)

    @property
    def state_cache_bytes(self) -> int:
        """The state cache's bound: SEAM_STATE_CACHE_MB, or a quarter of :func:`memory_limit` where it is 0."""
        return self.state_cache_mb << 20 if self.state_cache_mb else memory_limit() // 4

    @property
    def model_root(self) -> Path:
        """The folder deployments name model files in (SEAM_MODEL_DIR, else SEAM_MODEL_PATH's)."""
        return Path(self.model_dir) if self.model_dir else self.model_path.parent

    @property
    def kafka(self) -> Connection:
        """How every Kafka client of this worker connects: the brokers, and TLS and SASL as configured."""
        return Connection(self.broker_bootstrap, self.security_protocol, self.sasl_mechanism, self.sasl_username,
                          self.sasl_password, self.ssl_ca_file, self.ssl_cert_file, self.ssl_key_file,
                          self.ssl_key_password)

    @property
    def broker_bootstrap(self) -> str:
        """The broker list without the ``kafka://`` scheme, as plain Kafka clients want it."""
        return ",".join(part.split("://", 1)[-1] for part in self.broker_url.split(";"))


def memory_limit(proc: Path = Path("/proc")) -> int:
    """The memory this process may use, in bytes: the lowest limit of its memory cgroup and those above it
    (v2 ``memory.max``, v1 ``memory.limit_in_bytes``: a container's limit), else the host's physical memory.

    The cgroups are found as the kernel mounts them (``/proc/self/mountinfo``), v1 and v2 alike.
    """
    try:
        with open(proc / "meminfo") as meminfo:
            limit = next(int(line.split()[1]) << 10 for line in meminfo if line.startswith("MemTotal:"))
    except OSError:  # no /proc (not Linux): the physical memory as the C library reports it, and no cgroups
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        memberships = (proc / "self" / "cgroup").read_text().splitlines()
        mounts = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return limit
    hierarchies: dict[str, tuple[str, Path]] = {}  # "v2" or "memory": (the hierarchy's part mounted, where)
    for mount in mounts:  # "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
        fields_, _, fs = mount.partition(" - ")
        fs_type, _, options = (fs.split() + ["", "", ""])[:3]
        if fs_type == "cgroup2" or (fs_type == "cgroup" and "memory" in options.split(",")):
            mounted, where = fields_.split()[3:5]
            hierarchies.setdefault("v2" if fs_type == "cgroup2" else "memory", (mounted, Path(where)))
    for membership in memberships:  # "0::/path" (v2), "4:memory:/path" (v1)
        _, controllers, path = membership.split(":", 2)
        kind = "v2" if controllers == "" else "memory" if "memory" in controllers.split(",") else ""
        if kind not in hierarchies:
            continue
        root, point = hierarchies[kind]
        # A container sees its own cgroup at the mount point, whatever host path /proc/self/cgroup names.
        inside = path[len(root):] if path == root or path.startswith(root.rstrip("/") + "/") else ""
        folder = point / inside.strip("/")
        name = "memory.max" if kind == "v2" else "memory.limit_in_bytes"
        for held in (folder, *folder.parents):
            if not held.is_relative_to(point):
                break
            try:
                value = (held / name).read_text().strip()
            except OSError:
                continue
            if value.isdigit():
                limit = min(limit, int(value))
    return limit

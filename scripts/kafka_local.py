#!/usr/bin/env python3
"""Run a single-node Apache Kafka broker (KRaft, broker + controller) from Maven Central jars.

    python scripts/kafka_local.py up     # fetch jars, format storage once, start, wait until ready
    python scripts/kafka_local.py down   # stop the broker this script started (by PID)
    python scripts/kafka_local.py status
    python scripts/kafka_local.py purge  # remove the data of every broker here that is not running
    python scripts/kafka_local.py serve --advertise kafka   # in the foreground, on every interface (a container)
    python scripts/kafka_local.py tool kafka-consumer-groups --describe --group seam   # Kafka's own tools
    seam acls --command-config admin.properties | python scripts/kafka_local.py tools   # many, in one JVM
    python scripts/kafka_local.py up --secure --user seam=secret --user operator=secret2   # SASL_SSL + ACLs
    python scripts/kafka_local.py serve --advertise kafka --secure --secrets /run/secrets \
        --user-file seam=/run/secrets/seam.password   # secured, with certificates and passwords made beforehand

Secured (``--secure``, or KAFKA_SECURE=1): one SASL_SSL listener (SCRAM-SHA-512) with a certificate signed
by a CA made at the first start (the JDK's keytool), KRaft's StandardAuthorizer with ACLs and nothing
allowed without one, and SCRAM users bootstrapped into the metadata log when the storage is formatted:
``admin`` (a super user, for Kafka's tools: ``tool`` passes its client configuration) and every
``--user NAME=PASSWORD``. Its folder's ``secure/`` holds ``ca.pem`` (the CA clients trust) and
``admin.properties``. ``--secrets DIR`` takes the certificates and passwords from DIR instead (made
beforehand, as ``scripts/compose_secrets.py`` does for docker compose: ``broker.p12``, ``truststore.p12``,
``ca.pem``, ``store.password``, ``admin.password``), and ``--user-file NAME=FILE`` reads a user's password
from a file (a mounted secret) rather than the command line.

Settings (environment or flags): KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (port + 1000),
KAFKA_HOME (.cache/kafka: jars in libs-<version>/; data and logs in run-<port>/ unless --run-dir).
Only the standard library is used, so the broker can start before the project's virtualenv exists.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "scripts" / "kafka" / "pom.xml"
TOOLS_POM = ROOT / "scripts" / "kafka" / "tools-pom.xml"
RUN_EACH = ROOT / "scripts" / "kafka" / "RunEach.java"
# The scripts of Kafka's distribution (bin/<name>.sh), by the class each one runs.
TOOLS = {
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
}
TOOLS_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
"""
HEAP = os.environ.get("KAFKA_HEAP_OPTS", "-Xmx512m -Xms256m")

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""

CONSOLE_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
"""

COMMON_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
controller.listener.names=CONTROLLER
log.dirs={data_dir}
num.partitions=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
log.retention.hours=24
log.segment.bytes=104857600
"""
SERVER_PROPERTIES = COMMON_PROPERTIES + """\
listeners=PLAINTEXT://{listen}:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://{advertise}:{port}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
"""

# A secured broker: SASL_SSL for clients and between brokers, the controller's listener on 127.0.0.1 only.
SECURE_PROPERTIES = COMMON_PROPERTIES + """\
listeners=SASL_SSL://{listen}:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=SASL_SSL://{advertise}:{port}
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \
required username="admin" password="{admin_password}";
ssl.keystore.type=PKCS12
ssl.keystore.location={secure_dir}/broker.p12
ssl.keystore.password={store_password}
ssl.key.password={store_password}
ssl.truststore.type=PKCS12
ssl.truststore.location={secure_dir}/truststore.p12
ssl.truststore.password={store_password}
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:ANONYMOUS
"""
ADMIN_PROPERTIES = """\
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" \
password="{admin_password}";
ssl.truststore.type=PEM
ssl.truststore.location={secure_dir}/ca.pem
"""


class KafkaError(SystemExit):
    """A problem the user can act on; printed without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(f"kafka_local: {message}")


def kafka_version() -> str:
    text = POM.read_text()
    start = text.index("<kafka.version>") + len("<kafka.version>")
    return text[start : text.index("</kafka.version>")]


def require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaError(f"`{tool}` not found on PATH. {hint}")
    return path


def java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    for token in out.split():
        token = token.strip('"')
        if token[:1].isdigit():
            major = token.split(".")[0]
            return int(major if major != "1" else token.split(".")[1])
    return 0


def fetch_jars(home: Path, pom: Path = POM, prefix: str = "libs") -> Path:
    """Copy Kafka's jars (the broker's, or with ``TOOLS_POM`` the tools') from Maven Central into
    home/<prefix>-<version> once."""
    libs = home / f"{prefix}-{kafka_version()}"
    marker = libs / ".complete"
    if marker.exists():
        return libs
    mvn = require("mvn", "Install Maven 3.8+ (Debian/Ubuntu: apt install maven) to fetch Kafka's jars.")
    libs.mkdir(parents=True, exist_ok=True)
    print(f"kafka_local: fetching Apache Kafka {kafka_version()} {prefix} jars into {libs} ...", flush=True,
          file=sys.stderr)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
           f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise KafkaError("Maven could not fetch Kafka's jars:\n" + result.stdout[-3000:] + result.stderr[-2000:])
    marker.write_text(kafka_version())
    return libs


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def metadata_ok(port: int, timeout_s: float = 2.0) -> bool:
    """Send a Metadata v4 request (all topics) and check a well-formed answer with one broker."""
    client_id = b"seam-ready"
    body = struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id + struct.pack(">ib", -1, 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 4)
            payload = _recv_exact(sock, struct.unpack(">i", header)[0])
    except OSError:
        return False
    correlation_id, _throttle, brokers = struct.unpack(">iii", payload[:12])
    return correlation_id == 7 and brokers >= 1


def api_versions_ok(port: int, ca_file: Path, timeout_s: float = 2.0) -> bool:
    """A TLS connection whose certificate ``ca_file`` vouches for, and an ApiVersions answer (allowed before SASL)."""
    client_id = b"seam-ready"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 4)
            payload = _recv_exact(sock, struct.unpack(">i", header)[0])
    except (OSError, ssl.SSLError):
        return False
    correlation_id, error_code = struct.unpack(">ih", payload[:6])
    return correlation_id == 7 and error_code == 0


def make_certificates(secure_dir: Path, store_password: str, hosts: tuple[str, ...] = ()) -> None:
    """A CA, and a broker certificate it signs for 127.0.0.1, localhost and ``hosts`` (PKCS12 stores; the CA
    also as PEM)."""
    keytool = require("keytool", "Install a Java 17+ runtime, which has keytool (apt install openjdk-17-jre-headless).")
    secure_dir.mkdir(parents=True, exist_ok=True)
    names = "SAN=" + ",".join([*(f"dns:{host}" for host in ("localhost", *hosts)), "ip:127.0.0.1"])

    def run(*args: str) -> None:
        done = subprocess.run([keytool, *args, "-storepass", store_password], capture_output=True, text=True,
                              cwd=secure_dir)
        if done.returncode != 0:
            raise KafkaError(f"keytool {args[0]} failed:\n{done.stdout}{done.stderr}")

    run("-genkeypair", "-alias", "ca", "-dname", "CN=seam local CA", "-keyalg", "RSA", "-keysize", "2048",
        "-validity", "3650", "-ext", "bc:c", "-keystore", "ca.p12", "-storetype", "PKCS12")
    run("-exportcert", "-alias", "ca", "-rfc", "-file", "ca.pem", "-keystore", "ca.p12")
    run("-genkeypair", "-alias", "broker", "-dname", "CN=localhost", "-keyalg", "RSA", "-keysize", "2048",
        "-validity", "3650", "-ext", names, "-keystore", "broker.p12", "-storetype", "PKCS12")
    run("-certreq", "-alias", "broker", "-file", "broker.csr", "-keystore", "broker.p12")
    run("-gencert", "-alias", "ca", "-infile", "broker.csr", "-outfile", "broker.pem", "-rfc", "-validity", "3650",
        "-ext", names, "-keystore", "ca.p12")
    run("-importcert", "-alias", "ca", "-file", "ca.pem", "-noprompt", "-keystore", "broker.p12")
    run("-importcert", "-alias", "broker", "-file", "broker.pem", "-keystore", "broker.p12")
    run("-importcert", "-alias", "ca", "-file", "ca.pem", "-noprompt", "-keystore", "truststore.p12",
        "-storetype", "PKCS12")


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise OSError("connection closed")
        chunks += chunk
    return bytes(chunks)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); read its state to be sure.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def running_pid(pid_file: Path) -> int | None:
    """The PID a PID file names, if that process still runs."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


class Broker:
    """One broker instance: its ports and its folder (config, data, logs, PID file)."""

    def __init__(self, port: int, controller_port: int, home: Path, run_dir: Path | None = None, *,
                 secure: bool = False, users: dict[str, str] | None = None, secrets_dir: Path | None = None) -> None:
        self.port = port
        self.controller_port = controller_port
        self.home = home
        self.run_dir = run_dir or home / f"run-{port}"
        self.pid_file = self.run_dir / "kafka.pid"
        self.secure = secure
        self.users = dict(users or {})  # SCRAM users (secure): name -> password
        self.secure_dir = self.run_dir / "secure"  # what it writes: admin.properties, and the material below
        # The certificates and passwords (secure): made here at the first start, or read from a folder of
        # secrets made beforehand (a container's /run/secrets), which it never writes.
        self.material_dir = secrets_dir or self.secure_dir

    def ready(self) -> bool:
        if self.secure:
            return api_versions_ok(self.port, self.material_dir / "ca.pem")
        return metadata_ok(self.port)

    def _secrets(self) -> tuple[str, str]:
        """The admin user's password and the key stores' (made once, kept in the broker's folder)."""
        self.secure_dir.mkdir(parents=True, exist_ok=True)
        values = []
        for name in ("admin.password", "store.password"):
            path = self.material_dir / name
            if not path.exists():
                if self.material_dir != self.secure_dir:
                    raise KafkaError(f"{path} is missing (--secrets names a folder of secrets made beforehand)")
                path.write_text(secrets.token_urlsafe(18))
                path.chmod(0o600)
            values.append(path.read_text().rstrip("\r\n"))
        return values[0], values[1]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        return running_pid(self.pid_file)

    def _prepare(self, java: str, *, listen: str = "127.0.0.1", advertise: str = "127.0.0.1",
                 console: bool = False) -> tuple[list[str], Path, Path]:
        """Write the configuration, format the storage once; return the JVM command, the properties, the log dir."""
        libs = fetch_jars(self.home)
        data_dir = self.run_dir / "data"
        log_dir = self.run_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        props = self.run_dir / "server.properties"
        scram: list[str] = []
        if self.secure:
            admin_password, store_password = self._secrets()
            if not (self.material_dir / "broker.p12").exists():
                make_certificates(self.material_dir, store_password)
            props.write_text(SECURE_PROPERTIES.format(
                port=self.port, controller_port=self.controller_port, data_dir=data_dir, listen=listen,
                advertise=advertise, admin_password=admin_password, store_password=store_password,
                secure_dir=self.material_dir))
            props.chmod(0o600)
            admin = self.secure_dir / "admin.properties"
            admin.write_text(ADMIN_PROPERTIES.format(admin_password=admin_password, secure_dir=self.material_dir))
            admin.chmod(0o600)
            for name, password in {"admin": admin_password, **self.users}.items():
                scram += ["--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]"]
        else:
            props.write_text(SERVER_PROPERTIES.format(
                port=self.port, controller_port=self.controller_port, data_dir=data_dir, listen=listen,
                advertise=advertise))
        log_config = self.run_dir / "log4j2.properties"
        level = os.environ.get("KAFKA_LOG_LEVEL", "INFO")
        log_config.write_text(CONSOLE_LOG4J2.format(level=level) if console
                              else LOG4J2.format(log_dir=log_dir, level=level))
        jvm = [java, *HEAP.split(), "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
               f"-Dkafka.logs.dir={log_dir}", f"-Dlog4j2.configurationFile={log_config}",
               "-cp", f"{libs}/*"]
        if not (data_dir / "meta.properties").exists():
            # "=" form: a random id may start with "-", which would read as an option.
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            fmt = subprocess.run(
                [*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(props),
                 "--ignore-formatted", *scram], capture_output=True, text=True)
            if fmt.returncode != 0:
                raise KafkaError("formatting storage failed:\n" + fmt.stdout + fmt.stderr)
        return jvm, props, log_dir

    def serve(self, advertise: str) -> None:
        """Run the broker in this process (a container's entrypoint): listening on every interface, advertised
        as ``advertise``, logging to the console; it stops on SIGTERM."""
        java = require("java", "Install a Java 17+ runtime (Debian/Ubuntu: apt install openjdk-17-jre-headless).")
        jvm, props, _log_dir = self._prepare(java, listen="0.0.0.0", advertise=advertise, console=True)
        os.execv(java, [*jvm, "kafka.Kafka", str(props)])

    def up(self, wait_s: float = 90.0) -> None:
        if self.pid() is not None and self.ready():
            print(f"kafka_local: already running (pid {self.pid()}) on {self.bootstrap}")
            return
        java = require("java", "Install a Java 17+ runtime (Debian/Ubuntu: apt install openjdk-17-jre-headless).")
        if java_major(java) < 17:
            raise KafkaError("Apache Kafka 4 needs Java 17 or newer; `java -version` reports an older one.")
        for port in (self.port, self.controller_port):
            if not port_free(port):
                raise KafkaError(
                    f"port {port} on 127.0.0.1 is already in use. Stop whatever listens there, "
                    f"or pick another with KAFKA_PORT=<port> (controller: KAFKA_CONTROLLER_PORT)."
                )
        jvm, props, log_dir = self._prepare(java)
        with open(log_dir / "stdout.log", "ab") as out:
            proc = subprocess.Popen([*jvm, "kafka.Kafka", str(props)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise KafkaError(f"broker exited with code {proc.returncode}; see {log_dir}/server.log")
            if self.ready():
                print(f"kafka_local: Apache Kafka {kafka_version()} ready on {self.bootstrap} (pid {proc.pid})"
                      + (f", SASL_SSL (CA: {self.material_dir / 'ca.pem'})" if self.secure else ""))
                return
            time.sleep(0.25)
        self.down()
        raise KafkaError(f"broker did not answer a metadata request within {wait_s:.0f}s; see {log_dir}")

    def down(self, wait_s: float = 30.0) -> None:
        pid = self.pid()
        if pid is None:
            print(f"kafka_local: no broker running for port {self.port}")
            self.pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                _reap(pid)
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        print(f"kafka_local: broker on {self.bootstrap} stopped (pid {pid})")

    def status(self) -> int:
        pid = self.pid()
        ready = pid is not None and self.ready()
        print(f"kafka_local: {'running' if ready else 'not running'} on {self.bootstrap}"
              + (f" (pid {pid})" if pid else ""))
        return 0 if ready else 1


@contextlib.contextmanager
def broker_for(port: int, controller_port: int, home: Path) -> Iterator[tuple[Broker, bool]]:
    """The broker that answers on ``port`` (and ``False``), or one started for the caller (and ``True``)
    in a temporary folder, stopped and removed afterwards: a command that needs a broker for a while
    leaves no data behind."""
    if metadata_ok(port):
        yield Broker(port, controller_port, home), False
        return
    run_dir = Path(tempfile.mkdtemp(prefix=f"seam-kafka-{port}-"))
    broker = Broker(port, controller_port, home, run_dir)
    try:
        broker.up()
        yield broker, True
    finally:
        broker.down()
        shutil.rmtree(run_dir, ignore_errors=True)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
        os.waitpid(pid, os.WNOHANG)


def purge(home: Path) -> None:
    """Remove the folders (config, data, logs) of the brokers under ``home`` that are not running."""
    for run_dir in sorted(home.glob("run-*")):
        pid = Broker(0, 0, home, run_dir).pid()
        if pid is not None:
            print(f"kafka_local: {run_dir} belongs to a running broker (pid {pid}); kept")
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"kafka_local: removed {run_dir}")


def tool_argv(name: str, args: list[str], port: int, command_config: Path | None) -> list[str]:
    """One tool's class and arguments: against the local broker unless ``args`` name another, and on a secured
    one as its admin user (``command_config``: the broker's ``secure/admin.properties``)."""
    if name not in TOOLS:
        raise KafkaError(f"unknown tool {name!r}; one of: {', '.join(sorted(TOOLS))}")
    if not any(arg.startswith(("--bootstrap-server", "--bootstrap-controller")) for arg in args):
        args = [*args, "--bootstrap-server", f"127.0.0.1:{port}"]
    if command_config is not None and command_config.exists() and "--command-config" not in args:
        args = [*args, "--command-config", str(command_config)]
    return [TOOLS[name], *args]


def tools_jvm(home: Path) -> list[str]:
    """``java`` and its options for Kafka's tools (their jars fetched once)."""
    java = require("java", "Install a Java 17+ runtime (Debian/Ubuntu: apt install openjdk-17-jre-headless).")
    libs = fetch_jars(home, TOOLS_POM, "tools")
    log_config = libs / "log4j2-tools.properties"
    if not log_config.exists():
        log_config.write_text(TOOLS_LOG4J2)
    return [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log_config}", "-cp", f"{libs}/*"]


def run_tool(home: Path, name: str, args: list[str], port: int, command_config: Path | None = None) -> int:
    """Run one of Kafka's command-line tools (see :func:`tool_argv`)."""
    argv = tool_argv(name, args, port, command_config)
    return subprocess.run([*tools_jvm(home), *argv]).returncode


def run_tools(home: Path, lines: list[str], port: int, command_config: Path | None = None) -> int:
    """Run tool command lines (``kafka-acls --add ...``, as ``seam acls`` prints them) one after another in one
    JVM (``RunEach.java``), stopping at the first that fails: seconds saved per line. Each tool must return
    when it succeeds, as kafka-acls does (one that exits fails the run). Without ``RunEach.java`` (this script
    copied alone) or a Java runtime that can run a source file (one with the jdk.compiler module), each line
    runs in a JVM of its own."""
    runs = []
    for line in lines:
        if line.strip():
            name, *args = shlex.split(line)
            runs.append(tool_argv(name, args, port, command_config))
    jvm = tools_jvm(home)
    modules = subprocess.run([jvm[0], "--list-modules"], capture_output=True, text=True).stdout.split()
    if not RUN_EACH.exists() or not any(module.startswith("jdk.compiler@") for module in modules):
        return next((code for argv in runs if (code := subprocess.run([*jvm, *argv]).returncode)), 0)
    stdin = "".join("\0".join(argv) + "\n" for argv in runs)
    return subprocess.run([*jvm, str(RUN_EACH)], input=stdin, text=True).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["tool"], ["tools"]):
        if argv == ["tool"]:
            raise KafkaError(f"usage: kafka_local.py tool NAME [ARGS...]; NAME one of: {', '.join(sorted(TOOLS))}")
        home = Path(os.environ.get("KAFKA_HOME", ROOT / ".cache" / "kafka")).resolve()
        port = int(os.environ.get("KAFKA_PORT", "9092"))
        run_dir = Path(os.environ["KAFKA_RUN_DIR"]) if os.environ.get("KAFKA_RUN_DIR") else home / f"run-{port}"
        admin = run_dir / "secure" / "admin.properties"
        if argv[0] == "tools":  # command lines on standard input, all in one JVM
            return run_tools(home, sys.stdin.read().splitlines(), port, admin)
        return run_tool(home, argv[1], argv[2:], port, admin)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "fetch", "purge", "serve"])
    parser.add_argument("--port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")))
    parser.add_argument("--controller-port", type=int, default=int(os.environ.get("KAFKA_CONTROLLER_PORT", "0")))
    parser.add_argument("--home", type=Path, default=Path(os.environ.get("KAFKA_HOME", ROOT / ".cache" / "kafka")))
    parser.add_argument("--advertise", default="127.0.0.1",
                        help="serve: the host name clients are told to connect to (a container's service name)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="config, data, logs and PID file (default: <home>/run-<port>)")
    parser.add_argument("--secure", action="store_true", default=os.environ.get("KAFKA_SECURE", "") in ("1", "true"),
                        help="SASL_SSL (SCRAM-SHA-512), certificates made here, ACLs required (see above)")
    parser.add_argument("--user", action="append", default=[], metavar="NAME=PASSWORD",
                        help="secure: a SCRAM user, created when the storage is first formatted (repeatable)")
    parser.add_argument("--user-file", action="append", default=[], metavar="NAME=FILE",
                        help="secure: a SCRAM user whose password is FILE's content, such as a mounted secret")
    parser.add_argument("--secrets", type=Path, default=None, metavar="DIR",
                        help="secure: the certificates and passwords made beforehand (see above), not made here")
    args = parser.parse_args(argv)
    users = dict(user.split("=", 1) for user in args.user)
    for user in args.user_file:
        name, path = user.split("=", 1)
        try:
            users[name] = Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise KafkaError(f"--user-file {name}: cannot read {path} ({exc.strerror})") from None
    controller_port = args.controller_port or args.port + 1000
    run_dir = args.run_dir.resolve() if args.run_dir else None
    broker = Broker(args.port, controller_port, args.home.resolve(), run_dir, secure=args.secure, users=users,
                    secrets_dir=args.secrets)
    if args.command == "purge":
        purge(broker.home)
        return 0
    if args.command == "fetch":
        fetch_jars(broker.home)
        fetch_jars(broker.home, TOOLS_POM, "tools")
        return 0
    if args.command == "up":
        broker.up()
        return 0
    if args.command == "serve":
        broker.serve(args.advertise)
        return 0
    if args.command == "down":
        broker.down()
        return 0
    return broker.status()


if __name__ == "__main__":
    sys.exit(main())

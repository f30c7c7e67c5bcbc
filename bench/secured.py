"""The secured broker of the SASL_SSL mode, and a worker's settings for a :class:`tables.kafka.Connection`.

The benchmark measures what TLS and SASL cost, not ACLs: every client of the SASL_SSL mode (the load
generator, the benchmark's own readers and admin, the worker) connects as the broker's ``admin`` super user,
whose requests the authorizer allows without looking an ACL up.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from app.localhost import free_port
from tables.kafka import Connection

__all__ = ["MissingKeytool", "SecuredBroker", "worker_settings"]

KAFKA_LOCAL = Path(__file__).resolve().parent.parent / "scripts" / "kafka_local.py"
MECHANISM = "SCRAM-SHA-512"  # the only one scripts/kafka_local.py --secure enables


class MissingKeytool(RuntimeError):
    """The secured broker cannot start here: its certificates are made with the JDK's keytool, not installed."""


class SecuredBroker:
    """A SASL_SSL broker of ``scripts/kafka_local.py up --secure`` on free ports, in a folder of its own; stopped
    and removed on exit. Entering it returns the super user's :class:`Connection`."""

    def __init__(self) -> None:
        self.port, self.controller_port = free_port(), free_port()
        self.run_dir: Path | None = None

    def _call(self, action: str) -> subprocess.CompletedProcess[str]:
        assert self.run_dir is not None
        return subprocess.run([sys.executable, str(KAFKA_LOCAL), action, "--secure", "--port", str(self.port),
                               "--controller-port", str(self.controller_port), "--run-dir", str(self.run_dir)],
                              capture_output=True, text=True)

    def __enter__(self) -> Connection:
        if shutil.which("keytool") is None:
            raise MissingKeytool("the JDK's keytool is not on PATH (apt install openjdk-17-jre-headless), so the "
                                 "secured broker cannot make its certificates")
        self.run_dir = Path(tempfile.mkdtemp(prefix="seam-bench-kafka-secure-"))
        up = self._call("up")
        if up.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"could not start the secured Kafka broker:\n{up.stdout}{up.stderr}")
        secure = self.run_dir / "secure"
        return Connection(f"127.0.0.1:{self.port}", "SASL_SSL", MECHANISM, "admin",
                          (secure / "admin.password").read_text().rstrip("\r\n"), str(secure / "ca.pem"))

    def __exit__(self, *exc: object) -> None:
        if self.run_dir is not None:
            self._call("down")
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None


def worker_settings(connection: Connection, secrets_dir: Path) -> dict[str, str]:
    """The ``SEAM_*`` settings that make a worker connect as ``connection`` does; its secrets go into files in
    ``secrets_dir`` (``SEAM_..._FILE``, as mounted secrets), never into the environment."""
    env = {"SEAM_BROKER_URL": f"kafka://{connection.bootstrap}",
           "SEAM_SECURITY_PROTOCOL": connection.security_protocol}
    named = {"SEAM_SASL_MECHANISM": connection.sasl_mechanism, "SEAM_SASL_USERNAME": connection.username,
             "SEAM_SSL_CA_FILE": connection.ca_file, "SEAM_SSL_CERT_FILE": connection.cert_file,
             "SEAM_SSL_KEY_FILE": connection.key_file}
    env |= {name: value for name, value in named.items() if value}
    for name, secret in (("SEAM_SASL_PASSWORD_FILE", connection.password),
                         ("SEAM_SSL_KEY_PASSWORD_FILE", connection.key_password)):
        if secret:
            path = secrets_dir / name.removeprefix("SEAM_").removesuffix("_FILE").lower()
            path.touch(mode=0o600)
            path.write_text(secret)
            env[name] = str(path)
    return env

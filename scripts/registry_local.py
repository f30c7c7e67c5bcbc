#!/usr/bin/env python3
"""A local schema registry (Apicurio Registry, in-memory storage, Confluent-compatible API) next to the broker.

    python scripts/registry_local.py build                 # once: Maven builds it into .cache/registry
    python scripts/registry_local.py up [--port 8081]      # start it, wait until it answers, record its PID
    python scripts/registry_local.py status | down

The Confluent-compatible API is at ``http://127.0.0.1:PORT/apis/ccompat/v6`` (subjects, versions, schemas by
id, compatibility); the registry's own at ``/apis/registry/v2``. Storage is in memory: a restart forgets every
schema. ``--run-dir`` keeps the PID file and log elsewhere (the test session uses a temporary one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from kafka_local import pid_alive, running_pid

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "scripts" / "registry" / "pom.xml"
OUT = ROOT / ".cache" / "registry"


class RegistryError(SystemExit):
    """A problem the user can act on; printed without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(f"registry_local: {message}")


def runner(out: Path = OUT) -> Path:
    """The built registry's runnable jar (its libraries in ``lib/`` beside it)."""
    jars = sorted(out.glob("seam-schema-registry-*-runner.jar"))
    if not jars:
        raise RegistryError(f"no registry built in {out}: run `make registry` (scripts/registry_local.py build)")
    return jars[-1]


def build(out: Path = OUT) -> Path:
    """Build the registry with Maven unless its jar is already there (and newer than the pom)."""
    try:
        jar = runner(out)
        if jar.stat().st_mtime >= POM.stat().st_mtime:
            return jar
    except RegistryError:
        pass
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryError("Maven (mvn) is needed to build the registry")
    done = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "package", "-DskipTests", f"-Dregistry.out={out}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RegistryError(f"building the registry failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return runner(out)


def ready(port: int, timeout_s: float = 2.0) -> bool:
    """Whether a registry answers its Confluent-compatible API on ``port``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/apis/ccompat/v6/subjects",  # noqa: S310
                                    timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Registry:
    """One registry process on ``port``, its PID file and log in ``run_dir``."""

    def __init__(self, port: int, run_dir: Path | None = None) -> None:
        self.port = port
        self.run_dir = run_dir or OUT / f"run-{port}"
        self.pid_file = self.run_dir / "registry.pid"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v6"

    def pid(self) -> int | None:
        return running_pid(self.pid_file)

    def up(self, wait_s: float = 90.0) -> None:
        if self.pid() is not None and ready(self.port):
            print(f"registry_local: already running on {self.url} (pid {self.pid()})")
            return
        if ready(self.port):
            raise RegistryError(f"port {self.port} already answers as a registry that this run dir did not start")
        jar = build()
        java = shutil.which("java")
        if java is None:
            raise RegistryError("Java is needed to run the registry")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.run_dir / "registry.log", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [java, "-Xmx512m", f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
             "-Dquarkus.log.level=WARN", "-jar", str(jar)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.run_dir, start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + wait_s
        while not ready(self.port):
            if proc.poll() is not None:
                raise RegistryError(f"the registry exited with {proc.returncode}; log: {self.run_dir / 'registry.log'}")
            if time.monotonic() > deadline:
                self.down()
                raise RegistryError(f"the registry did not answer within {wait_s:.0f} s")
            time.sleep(0.3)
        print(f"registry_local: Apicurio Registry ready on {self.url} (pid {proc.pid})")

    def down(self, wait_s: float = 20.0) -> None:
        pid = self.pid()
        if pid is None:
            print(f"registry_local: no registry running from {self.run_dir}")
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        print(f"registry_local: registry on 127.0.0.1:{self.port} stopped (pid {pid})")

    def status(self) -> int:
        pid = self.pid()
        if pid is not None and ready(self.port):
            print(f"registry_local: running on {self.url} (pid {pid})")
            return 0
        print("registry_local: not running")
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "up", "down", "status"])
    parser.add_argument("--port", type=int, default=int(os.environ.get("REGISTRY_PORT", "8081")))
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"registry_local: built {build()}")
        return 0
    registry = Registry(args.port, args.run_dir)
    if args.command == "up":
        registry.up()
    elif args.command == "down":
        registry.down()
    else:
        return registry.status()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""seam in containers, as the README's Docker section runs it: Kafka and scaled workers with docker compose, a
worker killed, the service scaled down and up, every input answered.

    python scripts/compose_test.py             # make compose-test (make test runs it)
    python scripts/compose_test.py --secured   # make compose-test SECURE=1: docker-compose.secured.yml

1. A Docker engine: the running one, or ``dockerd`` started here (and stopped at the end) when it is installed
   and this user may. Without one (or without docker-compose and mmdebstrap) it says why and skips (exit 0);
   in CI (``CI`` set, and not ``0`` or ``false``), where ``make system-tools`` can install them, that fails (exit 1).
2. The images, built here (``scripts/images.py``: a Debian base, a wheelhouse, ``docker-compose.local.yml``).
3. ``docker-compose -f docker-compose.yml -f docker-compose.local.yml up -d --scale worker=3`` under a project
   name of its own; synthetic load from a container on the project's network (``run worker produce``);
   one worker container ``docker kill``-ed; ``--scale worker=2``, then ``--scale worker=4``.
4. Checks: every input answered (a prediction, a late record or a dead letter; read inside the network by
   ``scripts/compose_check.py``), ``/cluster/`` the same from every running worker and naming each of them,
   ``/features/<card>/`` the same from any worker, Prometheus scraping every worker; no service's process
   runs as root (uid 0) and web ports are published on 127.0.0.1 only.
5. ``docker-compose down -v``; no container, network or volume of the project is left.

``--secured`` runs the secured variant instead (``docker-compose.secured.yml`` over the same files, its secrets
made by ``scripts/compose_secrets.py`` in a temporary folder): Kafka on SASL_SSL with ACLs and 2 workers as
the SCRAM user ``seam``; synthetic load produced as ``operator``; every input answered and predictions among
the outputs (read as the broker's super user), and no service running as root.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import compose_secrets

from app.localhost import in_ci

ROOT = Path(__file__).resolve().parent.parent
PROJECT = f"seamct{uuid.uuid4().hex[:6]}"
COMPOSE = ["docker-compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"),
           "-f", str(ROOT / "docker-compose.local.yml")]
RATE, DURATION_S, CARDS = 150, 70, 300
SECURED_RECORDS = 400  # --secured: records produced as the operator


def say(message: str) -> None:
    print(f"compose-test: {message}", flush=True)


def run(cmd: list[str], *, check: bool = True, capture: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        raise SystemExit(f"compose-test: {' '.join(cmd)} failed ({result.returncode}):\n"
                         f"{result.stdout}\n{result.stderr}")
    return result


def cannot_run(reason: str) -> NoReturn:
    """Stop without running the scenario: a skip (exit 0) for a user without Docker, a failure (exit 1) in CI."""
    if in_ci():
        say(f"failed: {reason}; CI is set (CI={os.environ['CI']!r}), where `make system-tools` installs the tools, "
            "so the compose test fails instead of skipping")
        sys.exit(1)
    say(f"skipped: {reason}")
    sys.exit(0)


def engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def start_engine() -> subprocess.Popen[bytes] | None:
    """Start dockerd when it is installed and not running; None if one already runs. ``cannot_run`` without one."""
    for tool, package in (("docker", "docker.io"), ("docker-compose", "docker-compose"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            cannot_run(f"`{tool}` is not installed (Debian: apt install {package}; make system-tools does as root)")
    if engine_up():
        return None
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        cannot_run("no Docker engine runs and this user cannot start dockerd (it needs root)")
    log = open("/tmp/seam-dockerd.log", "ab")  # noqa: SIM115 - open for the daemon's lifetime
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            cannot_run(f"dockerd exited with {daemon.returncode} (see /tmp/seam-dockerd.log)")
        if engine_up():
            say(f"started dockerd (pid {daemon.pid})")
            return daemon
        time.sleep(0.5)
    daemon.terminate()
    cannot_run("dockerd did not answer within 60 s (see /tmp/seam-dockerd.log)")


def wait_for(what: str, condition: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except (OSError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1)
    raise SystemExit(f"compose-test: {what} not reached within {timeout_s:.0f} s (last: {last!r})\n{logs()}")


def logs() -> str:
    return run([*COMPOSE, "logs", "--tail", "20"], check=False).stdout[-6000:]


def read(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:  # noqa: S310 - loopback
        body: bytes = response.read()
        return body


def get(port: int, path: str) -> Any:
    return json.loads(read(port, path))


def workers() -> dict[str, int]:
    """Running worker containers -> the host port their web view is published on."""
    ids = run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
               "--filter", "label=com.docker.compose.service=worker", "--filter", "status=running",
               "--filter", "label=com.docker.compose.oneoff=False"]).stdout.split()  # not the load generator
    found = {}
    for container in ids:
        mapping = run(["docker", "port", container, "6066/tcp"]).stdout.split()[0]
        host, port = mapping.rsplit(":", 1)
        if host != "127.0.0.1":
            raise SystemExit(f"compose-test: {container}'s web port is published on {host}, not on 127.0.0.1 only")
        found[container] = int(port)
    return found


def service_users() -> dict[str, set[str]]:
    """Each service with running containers -> the uids (real, effective, saved, filesystem) of their main
    processes, as the kernel reports them inside each container (/proc/1/status): what runs, not what the
    image asks for."""
    ids = run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
               "--filter", "status=running", "--filter", "label=com.docker.compose.oneoff=False"]).stdout.split()
    users: dict[str, set[str]] = {}
    for container in ids:
        service = run(["docker", "inspect", "--format", '{{index .Config.Labels "com.docker.compose.service"}}',
                       container]).stdout.strip()
        status = run(["docker", "exec", container, "cat", "/proc/1/status"]).stdout
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        users.setdefault(service, set()).update(uids)
    return users


def check_not_root(services: set[str]) -> None:
    """Every service in ``services`` runs, and no process of theirs as root."""
    users = service_users()
    if set(users) != services:
        raise SystemExit(f"compose-test: running services {sorted(users)}, expected {sorted(services)}")
    root = sorted(service for service, uids in users.items() if "0" in uids)
    if root:
        raise SystemExit(f"compose-test: {', '.join(root)} run(s) as root (uid 0): {users}")
    say("no container runs as root: " + ", ".join(f"{service} uid {'/'.join(sorted(uids))}"
                                                  for service, uids in sorted(users.items())))


def consistent_cluster(expected: int) -> dict[str, Any] | None:
    """Every running worker is ready and serves the same /cluster/ view, naming ``expected`` workers."""
    ports = workers()
    if len(ports) != expected or not all(get(port, "/ready/")["ready"] for port in ports.values()):
        return None
    views = [get(port, "/cluster/") for port in ports.values()]
    shapes = {json.dumps({"generation": v["generation"], "workers": sorted(
        (w["url"], json.dumps(w["active"], sort_keys=True)) for w in v["workers"])}) for v in views}
    if len(shapes) != 1 or len(views[0]["workers"]) != expected:
        return None
    owned = sorted(p for w in views[0]["workers"] for p in w["input_partitions"])
    return views[0] if owned == list(range(8)) else None


def scale(count: int) -> None:
    say(f"scaling the worker service to {count}")
    run([*COMPOSE, "up", "-d", "--no-recreate", "--scale", f"worker={count}"])
    states = run(["docker", "ps", "-a", "--format", "{{.Names}} {{.State}}", "--filter",
                  f"label=com.docker.compose.project={PROJECT}", "--filter", "label=com.docker.compose.service=worker",
                  "--filter", "label=com.docker.compose.oneoff=False"]).stdout.split("\n")
    say("worker containers: " + ", ".join(sorted(line for line in states if line)))


def handled() -> float:
    """Input records the running workers have handled (their seam_events_in counters, summed)."""
    total = 0.0
    for port in workers().values():
        for line in read(port, "/metrics").decode().splitlines():
            if line.startswith("seam_events_in_total "):
                total += float(line.split()[1])
    return total


def load_flows(records: int) -> None:
    """Wait until the running workers have handled ``records`` more input records than now."""
    start = handled()
    wait_for(f"{records} more records handled", lambda: handled() >= start + records, 120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secured", action="store_true", help="the secured variant (docker-compose.secured.yml)")
    args = parser.parse_args()
    started = time.monotonic()
    # docker-compose.yml has no default for Grafana's admin password (its service is left out here).
    os.environ.setdefault("GRAFANA_ADMIN_PASSWORD", secrets.token_urlsafe(16))
    daemon = start_engine()
    try:
        run([sys.executable, str(ROOT / "scripts" / "images.py")], capture=False)
        say(f"images built ({time.monotonic() - started:.0f} s); project {PROJECT}")
        secrets_dir = tempfile.TemporaryDirectory(prefix="seam-compose-secrets-") if args.secured else None
        try:
            if secrets_dir is not None:
                return secured_scenario(started, Path(secrets_dir.name))
            return scenario(started)
        finally:
            run([*COMPOSE, "down", "-v", "--remove-orphans"], check=False)
            label = f"label=com.docker.compose.project={PROJECT}"
            left = {kind: run(["docker", kind, "ls", "-q", "--filter", label], check=False).stdout.split()
                    for kind in ("container", "network", "volume")}
            left["container"] = run(["docker", "ps", "-aq", "--filter", label], check=False).stdout.split()
            if any(left.values()):
                raise SystemExit(f"compose-test: left behind after down -v: {left}")
            say("down -v: no containers, networks or volumes of the project left")
            if secrets_dir is not None:
                secrets_dir.cleanup()
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
            say("stopped the dockerd it started")


def prometheus_port_free() -> None:
    """Stop at once if this host's port 9090 is taken: docker-compose.yml publishes Prometheus there."""
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", 9090)) == 0:
            raise SystemExit("compose-test: port 9090 on this host is in use; docker-compose.yml publishes "
                             "Prometheus there")


def scenario(started: float) -> int:
    prometheus_port_free()
    run([*COMPOSE, "up", "-d", "--scale", "worker=3"])
    first = wait_for("3 ready workers agreeing on /cluster/", lambda: consistent_cluster(3), 180)
    say(f"3 workers up, generation {first['generation']} ({time.monotonic() - started:.0f} s)")
    check_not_root({"kafka", "worker", "prometheus"})
    say("the workers' web ports are published on 127.0.0.1 only")  # workers() refuses any other address
    load = subprocess.Popen([*COMPOSE, "run", "--rm", "-T", "worker", "produce", "--rate", str(RATE), "--duration",
                             str(DURATION_S), "--cards", str(CARDS), "--seed", "17"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    load_flows(RATE * 10)
    victim = next(iter(workers()))
    say(f"docker kill {victim[:12]} (under load)")
    run(["docker", "kill", victim])
    wait_for("2 workers agreeing after the kill", lambda: consistent_cluster(2), 120)
    scale(2)
    wait_for("2 workers agreeing at scale 2", lambda: consistent_cluster(2), 120)
    load_flows(RATE * 5)
    scale(4)
    view = wait_for("4 workers agreeing at scale 4", lambda: consistent_cluster(4), 180)
    say(f"4 workers, generation {view['generation']}")
    output, _ = load.communicate(timeout=DURATION_S + 120)
    if load.returncode != 0:
        raise SystemExit(f"compose-test: the load generator failed:\n{output}")
    say("load: " + output.strip().splitlines()[-1])
    summary = answered(RATE * DURATION_S)
    ports = workers()
    for card in summary["cards"]:
        views = [get(port, f"/features/{card}/") for port in ports.values()]
        answers = {json.dumps({k: v for k, v in view.items() if k != "served_by"}, sort_keys=True) for view in views}
        if len(answers) != 1:
            raise SystemExit(f"compose-test: /features/{card}/ differs between workers: {views}")
    say(f"/features/<card>/ the same from all {len(ports)} workers for {', '.join(summary['cards'])}")

    def scraped() -> bool:
        result = get(9090, "/api/v1/query?query=up%7Bjob%3D%22seam%22%7D")["data"]["result"]
        return len(result) == len(ports) and all(r["value"][1] == "1" for r in result)

    wait_for(f"Prometheus scraping all {len(ports)} workers", scraped, 60)
    say(f"Prometheus scrapes all {len(ports)} workers; passed in {time.monotonic() - started:.0f} s")
    return 0


def answered(inputs: int, run_options: tuple[str, ...] = ()) -> dict[str, Any]:
    """``scripts/compose_check.py``'s summary, read inside the network (``run_options``: of its ``docker-compose
    run``); fails unless the input topic holds ``inputs`` records and every one was answered."""
    with open(ROOT / "scripts" / "compose_check.py") as script:
        check = run([*COMPOSE, "run", "--rm", "-T", *run_options, "--entrypoint", "python", "worker", "-"],
                    stdin=script, check=False)
    lines = [line for line in check.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"compose-test: the check printed nothing:\n{check.stdout}\n{check.stderr}")
    summary: dict[str, Any] = json.loads(lines[-1])
    say(f"outputs: {summary}")
    if check.returncode != 0 or summary["unanswered"] or summary["inputs"] != inputs:
        raise SystemExit(f"compose-test: not every input was answered: {summary}")
    return summary


def as_user(secrets: Path, user: str) -> tuple[str, ...]:
    """``docker-compose run`` options that make a worker container connect as ``user`` (its password mounted
    for that one command: the worker service has only its own)."""
    return ("-e", f"SEAM_SASL_USERNAME={user}", "-e", f"SEAM_SASL_PASSWORD_FILE=/run/secrets/{user}.password",
            "-v", f"{secrets / f'{user}.password'}:/run/secrets/{user}.password:ro")


def secured_scenario(started: float, secrets: Path) -> int:
    """Kafka on SASL_SSL with ACLs and 2 workers as ``seam``; load as ``operator``; every input answered."""
    compose_secrets.make(secrets)
    os.environ["SEAM_COMPOSE_SECRETS"] = str(secrets)  # docker-compose.secured.yml's secrets' folder
    COMPOSE.extend(["-f", str(ROOT / "docker-compose.secured.yml")])
    prometheus_port_free()
    run([*COMPOSE, "up", "-d", "--scale", "worker=2"])
    first = wait_for("2 ready workers agreeing on /cluster/ (on SASL_SSL)", lambda: consistent_cluster(2), 240)
    say(f"2 workers up as SCRAM user seam, generation {first['generation']} ({time.monotonic() - started:.0f} s)")
    check_not_root({"kafka", "worker", "prometheus"})
    # --no-deps: not the one-shot kafka-acls service again
    load = run([*COMPOSE, "run", "--rm", "-T", "--no-deps", *as_user(secrets, "operator"), "worker", "produce",
                "--rate", "200", "--duration", str(SECURED_RECORDS / 200), "--cards", "50", "--seed", "17"])
    say("load (as operator): " + load.stdout.strip().splitlines()[-1])
    summary = answered(SECURED_RECORDS, ("--no-deps", *as_user(secrets, "admin")))  # admin: reads every topic
    if not summary["outputs"].get("prediction"):
        raise SystemExit(f"compose-test: no prediction among the outputs: {summary}")
    say(f"secured variant passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

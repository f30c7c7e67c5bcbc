"""Shared fixtures: one real Kafka broker (and, for the tests that ask, one schema registry) per test session,
workers as real subprocesses."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.localhost import free_port
from tests.integration.kafka_helpers import Secured

ROOT = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = ROOT / "scripts" / "kafka_local.py"
REGISTRY_LOCAL = ROOT / "scripts" / "registry_local.py"
SECURED_USERS = ("worker", "operator", "intruder")


@pytest.fixture(scope="module", params=["slices", "indexed"])
def window_paths(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a module twice: with no card's windows indexed, and with every card's from its first event
    (``tables.features.HOT_EVENTS``, ``INDEX_AFTER``).

    Module-scoped, so hypothesis tests may use it; ``pytestmark = pytest.mark.usefixtures("window_paths")``.
    """
    with _paths(request.param):
        yield request.param


@pytest.fixture(scope="module", params=["slices", "indexed", "tiled"])
def state_paths(request: pytest.FixtureRequest) -> Iterator[str]:
    """:func:`window_paths`, and a third time with every key tiled (``tables.tiles``) as soon as its state cache
    has written it: sealed chunks of two events, tiles a fifth of the largest window wide, cut wherever one
    event is due."""
    with _paths(request.param):
        yield request.param


@contextmanager
def _paths(path: str) -> Iterator[None]:
    from tables import features, key_store

    before = (features.HOT_EVENTS, features.INDEX_AFTER, features.SPILL_EVENTS, features.TILES_PER_WINDOW,
              key_store.CHUNK_EVENTS)
    features.HOT_EVENTS = 1 if path in ("indexed", "tiled") else 1 << 62
    features.INDEX_AFTER = 0
    if path == "tiled":
        features.SPILL_EVENTS, features.TILES_PER_WINDOW, key_store.CHUNK_EVENTS = 1, 5, 2
    try:
        yield
    finally:
        (features.HOT_EVENTS, features.INDEX_AFTER, features.SPILL_EVENTS, features.TILES_PER_WINDOW,
         key_store.CHUNK_EVENTS) = before


@contextmanager
def _local_service(script: Path, what: str, *options: str) -> Iterator[None]:
    """Run ``script up OPTIONS`` (a local server the project starts), then ``script down OPTIONS`` at the end."""
    started = subprocess.run([sys.executable, str(script), "up", *options], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"could not start {what}:\n{started.stdout}\n{started.stderr}")
    try:
        yield
    finally:
        subprocess.run([sys.executable, str(script), "down", *options], capture_output=True, text=True)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real single-node Kafka broker for the whole session (or SEAM_TEST_BOOTSTRAP when set)."""
    external = os.environ.get("SEAM_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    port, controller_port = free_port(), free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="seam-kafka-"))
    try:
        with _local_service(KAFKA_LOCAL, "Kafka", "--port", str(port), "--controller-port", str(controller_port),
                            "--run-dir", str(run_dir)):
            yield f"127.0.0.1:{port}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def secured() -> Iterator[Secured]:
    """A secured broker for the session (SASL_SSL, SCRAM-SHA-512, nothing allowed without an ACL), with the users
    ``worker``, ``operator`` and ``intruder``; the benchmark's SASL_SSL mode and the secured tests share it."""
    port, controller_port = free_port(), free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="seam-kafka-secure-"))
    passwords = {user: secrets.token_urlsafe(12) for user in SECURED_USERS}
    users = [arg for user, password in passwords.items() for arg in ("--user", f"{user}={password}")]
    options = ["--secure", "--port", str(port), "--controller-port", str(controller_port), "--run-dir", str(run_dir)]
    try:
        with _local_service(KAFKA_LOCAL, "the secured Kafka broker", *options, *users):
            # The broker's own super user (made at its start): only the tests read what nobody else was granted.
            passwords["admin"] = (run_dir / "secure" / "admin.password").read_text()
            yield Secured(f"127.0.0.1:{port}", run_dir / "secure" / "ca.pem", run_dir, passwords)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A real schema registry (Apicurio, in memory) for the session, started on first use: its Confluent-compatible
    API's base URL (or SEAM_TEST_REGISTRY_URL when set)."""
    external = os.environ.get("SEAM_TEST_REGISTRY_URL")
    if external:
        yield external
        return
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="seam-registry-"))
    try:
        with _local_service(REGISTRY_LOCAL, "the schema registry", "--port", str(port), "--run-dir", str(run_dir)):
            yield f"http://127.0.0.1:{port}/apis/ccompat/v6"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic names and app ids."""
    return uuid.uuid4().hex[:10]

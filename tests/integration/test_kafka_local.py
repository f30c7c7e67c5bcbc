"""The broker launcher fails with actionable messages, and the session broker answers metadata."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.localhost import free_port
from tests.conftest import KAFKA_LOCAL

pytestmark = pytest.mark.integration


def run_launcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(KAFKA_LOCAL), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_port_in_use_is_reported_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launcher("up", "--port", str(port), "--controller-port", str(free_port()),
                              "--run-dir", str(tmp_path))
    assert result.returncode != 0
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "KAFKA_PORT" in result.stderr


def test_missing_java_is_reported_with_the_fix(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # an empty PATH: no java, no mvn
    result = run_launcher("up", "--port", str(free_port()), "--run-dir", str(tmp_path), env=env)
    assert result.returncode != 0
    assert "`java` not found on PATH" in result.stderr
    assert "Java 17+" in result.stderr


def test_status_of_a_stopped_broker_is_not_running(tmp_path: Path) -> None:
    result = run_launcher("status", "--port", str(free_port()), "--run-dir", str(tmp_path))
    assert result.returncode == 1
    assert "not running" in result.stdout


def test_session_broker_answers_a_metadata_request(kafka_bootstrap: str) -> None:
    sys.path.insert(0, str(KAFKA_LOCAL.parent))
    try:
        import kafka_local
    finally:
        sys.path.pop(0)
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    assert kafka_local.metadata_ok(port)
    assert not kafka_local.metadata_ok(free_port())

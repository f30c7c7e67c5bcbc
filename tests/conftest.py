"""Shared fixtures: one real Kafka broker per test session, workers as real subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.localhost import free_port

ROOT = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = ROOT / "scripts" / "kafka_local.py"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A real single-node Kafka broker for the whole session (or SEAM_TEST_BOOTSTRAP when set)."""
    external = os.environ.get("SEAM_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    port, controller_port = free_port(), free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="seam-kafka-"))
    args = [sys.executable, str(KAFKA_LOCAL), "--port", str(port), "--controller-port",
            str(controller_port), "--run-dir", str(run_dir)]
    started = subprocess.run([*args[:2], "up", *args[2:]], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"could not start Kafka:\n{started.stdout}\n{started.stderr}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*args[:2], "down", *args[2:]], capture_output=True, text=True)
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic names and app ids."""
    return uuid.uuid4().hex[:10]

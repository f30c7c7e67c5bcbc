"""seam installed as users install it: the built wheel in a fresh virtual environment outside the checkout, a
worker started from an empty folder against the real broker, ready with the model the wheel ships."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from app.localhost import Subprocess, free_port, worker_env
from tests.integration.kafka_helpers import Topics, prepare_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def get(port: int, path: str) -> tuple[int, dict[str, object]] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:  # noqa: S310
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())
    except OSError:
        return None


def test_the_installed_wheel_runs_a_ready_worker_from_an_empty_folder(kafka_bootstrap: str, tmp_path: Path,
                                                                    unique: str) -> None:
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", wheels, ROOT, cwd=tmp_path)
    (wheel,) = wheels.glob("seam-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)
    seam = venv / "bin" / "seam"
    empty = tmp_path / "somewhere"
    empty.mkdir()
    # The installed package, not the checkout: nothing of it may be importable from the checkout.
    site = run(venv / "bin" / "python", "-c", "import app, models; print(app.__file__); print(models.EXAMPLE_MODEL)",
               cwd=empty).split()
    assert all(str(venv) in line and str(ROOT) not in line for line in site), site
    assert "worker" in run(seam, "--help", cwd=empty)

    topics = Topics.unique(unique)
    prepare_topics(kafka_bootstrap, topics, partitions=2)
    port = free_port()
    env = worker_env(topics.env() | {"SEAM_BROKER_URL": f"kafka://{kafka_bootstrap}", "SEAM_WEB_PORT": str(port),
                                     "SEAM_TOPIC_PARTITIONS": "2"})
    env.pop("PYTHONPATH", None)
    worker = Subprocess([str(seam), "worker", "-l", "info"], env, tmp_path / "worker.log", cwd=empty)
    try:
        deadline = time.monotonic() + 90
        ready = None
        while time.monotonic() < deadline and worker.running():
            ready = get(port, "/ready/")
            if ready is not None and ready[0] == 200:
                break
            time.sleep(0.2)
        assert ready is not None and ready[0] == 200, f"not ready: {ready}\n{worker.log_tail()}"
        model = get(port, "/model/")
        assert model is not None and model[0] == 200, model
        assert model[1]["model"] == "fraud-mlp@1" and str(venv) in str(model[1]["path"]), model
    finally:
        assert worker.stop() == 0, worker.log_tail()
    # State went to the working directory's .data, never into the installed package.
    assert (empty / ".data").is_dir() and any((empty / ".data").iterdir())
    assert not list(venv.rglob(".data"))

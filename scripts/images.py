#!/usr/bin/env python3
"""Build seam's container images here, from Debian's packages, Maven Central and the Python package index on the
host, for machines whose containers reach neither public images nor the index.

    python scripts/images.py            # seam-base:bookworm (once), the wheelhouse, then the compose images
    python scripts/images.py --rebuild  # the base image too

* ``seam-base:bookworm``: ``mmdebstrap --variant=minbase`` of Debian bookworm with Python 3.11, imported into
  Docker (about 20 s). Containers built on it use ``apt-get`` against Debian's mirrors as the host does.
* ``docker/wheels``: ``pip wheel`` of the project's dependencies, on the host (the worker image installs
  from it with ``--no-index``).
* The images of ``docker-compose.local.yml`` (the worker, Kafka from ``.cache/kafka``'s jars, Prometheus),
  built by ``docker-compose build``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "seam-base:bookworm"
WHEELS = ROOT / "docker" / "wheels"
COMPOSE = ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.local.yml")]


def run(cmd: list[str], **kwargs: object) -> None:
    print("images: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def has_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def base_image(rebuild: bool) -> None:
    if has_image(BASE) and not rebuild:
        return
    if shutil.which("mmdebstrap") is None:
        raise SystemExit("images: mmdebstrap is needed for the base image (Debian: apt install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="seam-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        run(["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(rootfs)])
        run(["docker", "import", str(rootfs), BASE], stdout=subprocess.DEVNULL)


def wheelhouse() -> None:
    for old in WHEELS.glob("*.whl"):
        old.unlink()
    # setuptools and wheel too: the image builds seam's own wheel from its sources without the index.
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(WHEELS), str(ROOT),
         "setuptools>=77", "wheel"])
    # seam's own wheel differs with every build of it; the image builds seam from its sources in a later layer,
    # so the wheelhouse (and the image's layer of dependencies) stays the same until a dependency changes.
    for own in WHEELS.glob("seam-*.whl"):
        own.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="rebuild the base image as well")
    args = parser.parse_args()
    started = time.monotonic()
    run([sys.executable, str(ROOT / "scripts" / "kafka_local.py"), "fetch"])
    base_image(args.rebuild)
    wheelhouse()
    # docker-compose.yml has no default for Grafana's admin password, and compose refuses the file without
    # one even to build; building reads none (and Grafana's image is pulled, not built).
    env = {"GRAFANA_ADMIN_PASSWORD": "unused-when-building", **os.environ}
    run([*COMPOSE, "build"], stdout=subprocess.DEVNULL, env=env)
    print(f"images: built in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

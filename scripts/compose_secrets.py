#!/usr/bin/env python3
"""Make the secrets of the secured compose variant (docker-compose.secured.yml) into a folder git ignores.

    python scripts/compose_secrets.py                  # .secrets/compose (make compose-secrets)
    python scripts/compose_secrets.py --dir /some/dir  # elsewhere: then SEAM_COMPOSE_SECRETS=/some/dir

* ``ca.pem``: the CA the workers trust (its key stays in ``ca.p12``, which no container mounts);
  ``broker.p12`` (the broker's key and its certificate for ``kafka``, ``localhost`` and ``127.0.0.1``) and
  ``truststore.p12`` (the CA, for the broker's own connections), both locked with ``store.password``
  (the JDK's keytool, as ``scripts/kafka_local.py up --secure`` makes them).
* ``admin.password`` (the broker's super user, for Kafka's tools), ``seam.password`` (the workers' SCRAM
  user) and ``operator.password`` (the operator's: model deployments, dead-letter replays, synthetic load):
  the broker adds the SCRAM users when it formats its storage, at its first start.
* ``acls.txt``: ``seam acls`` for docker-compose.yml's workers (``User:seam``, ``User:operator``), which the
  variant's ``kafka-acls`` service applies before any worker starts.

What exists is kept: a broker formatted with these passwords knows no others (``docker compose down -v``
before making new ones). The folder is closed to other users of this host (0700); its files are readable
(0644) because compose mounts them into containers that run as users of their own.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import kafka_local

from app.acls import commands
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".secrets" / "compose"
USERS = ("admin", "seam", "operator")
# Where the kafka-acls service finds the admin's client configuration: the broker writes it into its volume.
ADMIN_PROPERTIES = "/var/lib/kafka/data/secure/admin.properties"
# docker-compose.yml's worker settings that name what the ACLs grant (its topics are seam's defaults).
WORKER_ENV = {"SEAM_BROKER_URL": "kafka://kafka:9092"}


def password(path: Path) -> str:
    """The password in ``path``, made (and written) if there is none."""
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24))
    return path.read_text()


def make(folder: Path) -> list[str]:
    """Make what ``folder`` lacks; the names of the files made."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    before = {path.name for path in folder.iterdir()}
    store_password = password(folder / "store.password")
    for user in USERS:
        password(folder / f"{user}.password")
    if not (folder / "broker.p12").exists():
        kafka_local.make_certificates(folder, store_password, hosts=("kafka",))
        for leftover in ("broker.csr", "broker.pem"):
            (folder / leftover).unlink(missing_ok=True)
    acls = folder / "acls.txt"
    if not acls.exists():
        settings = Settings.from_env(WORKER_ENV)
        lines = commands(settings, worker="User:seam", operator="User:operator", command_config=ADMIN_PROPERTIES)
        acls.write_text("".join(f"{line}\n" for line in lines))
    for path in folder.iterdir():
        path.chmod(0o600 if path.name == "ca.p12" else 0o644)
    return sorted({path.name for path in folder.iterdir()} - before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where (default: {DEFAULT_DIR})")
    args = parser.parse_args()
    made = make(args.dir.resolve())
    print(f"compose-secrets: {args.dir}: " + (f"made {', '.join(made)}" if made else "all there, kept"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

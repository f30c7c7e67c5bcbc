"""seam on a secured cluster: SASL_SSL (SCRAM-SHA-512), ACLs from ``seam acls``, three principals.

One broker for the session (the ``secured`` fixture: ``scripts/kafka_local.py up --secure``, which the
benchmark's SASL_SSL mode shares): TLS with a CA made at its start,
StandardAuthorizer with nothing allowed without an ACL. The **worker** gets exactly what ``seam acls``
grants it, the **operator** what it grants the operator, the **intruder** nothing. Everything a run
writes (worker logs, data folders, command output) is searched for the passwords afterwards.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from app.acls import acls
from app.localhost import free_port, worker_env
from app.settings import Settings
from app.synthetic import TransactionGenerator
from tables.kafka import client_options
from tests.integration.kafka_helpers import (
    Secured,
    Topics,
    Worker,
    collect,
    encode,
    prepare_topics,
    produce_raw,
)
from tests.integration.test_kill import sigkills_lose_nothing

ROOT = Path(__file__).resolve().parents[2]


def seam(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=ROOT,
                          env=worker_env(env), timeout=120)


def settings_for(unique: str) -> dict[str, str]:
    """One test's app id and topics, the control and shadow topics too."""
    return Topics.unique(unique).env() | {"SEAM_MODEL_CONTROL_TOPIC": f"ctl-{unique}",
                                          "SEAM_SHADOW_TOPIC": f"shadow-{unique}"}


def grant(secured: Secured, settings: dict[str, str]) -> None:
    """Apply the ACLs ``seam acls`` prints for this app id and these topics (worker and operator), each line with
    Kafka's own kafka-acls, all in one JVM; then the broker holds exactly the ACL set seam documents."""
    printed = seam(secured.env("operator") | settings, "acls", "--worker", "User:worker",
                   "--operator", "User:operator", "--command-config", str(secured.run_dir / "secure" /
                                                                            "admin.properties"))
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.strip().splitlines()
    assert lines and all(line.startswith("kafka-acls --bootstrap-server ") for line in lines)
    listing = "kafka-acls --list --principal User:worker --principal User:operator"
    done = secured.tools([*lines, listing])
    assert done.returncode == 0, f"{printed.stdout}\n{done.stdout}\n{done.stderr}"
    # Each line grants the cross product of its principals, operations and resources: nothing beyond the set.
    documented = acls(Settings.from_env(secured.env("operator") | settings), worker="User:worker",
                      operator="User:operator")
    expected = {(a.principal, a.resource, a.name, a.pattern, operation)
                for a in documented for operation in a.operations}
    names = {name for _principal, _resource, name, _pattern, _operation in expected}
    held = {acl for acl in listed(done.stdout.split("ACLs for principal", 1)[1]) if acl[2] in names}
    assert held == expected, (held - expected, expected - held)


LISTED = re.compile(r"^Current ACLs for resource `ResourcePattern\(resourceType=(\w+), name=(.*), "
                    r"patternType=(\w+)\)`:\n((?:\t.*\n)*)", re.MULTILINE)
ENTRY = re.compile(r"\(principal=(.+), host=\*, operation=(\w+), permissionType=ALLOW\)")


def listed(text: str) -> set[tuple[str, str, str, str, str]]:
    """``kafka-acls --list`` output as (principal, resource, name, pattern, operation), spelled as ``seam acls``
    spells them (``TRANSACTIONAL_ID``: ``transactional-id``, ``IDEMPOTENT_WRITE``: ``IdempotentWrite``)."""
    return {(principal, resource.lower().replace("_", "-"), name, pattern.lower(),
             operation.title().replace("_", ""))
            for resource, name, pattern, entries in LISTED.findall(text)
            for principal, operation in ENTRY.findall(entries)}


@pytest.fixture(scope="module")
def granted(secured: Secured) -> tuple[Topics, dict[str, str]]:
    """One app id and its topics for the module, with the ACLs ``seam acls`` prints applied."""
    unique = secrets.token_hex(5)
    settings = settings_for(unique)
    grant(secured, settings)
    return Topics.unique(unique), settings


def transactions(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    # Each seed's stream starts days after the one before, so a later test's events are not late for the
    # watermark an earlier one left in the shared app's state.
    generator = TransactionGenerator(cards=50, seed=seed, late_rate=0.0, id_prefix=f"s{seed}",
                                     start_ms=1_764_500_000_000 + seed * 86_400_000 * 10)
    return [encode(next(generator)[0]) for _ in range(count)]


@pytest.mark.parametrize(("guarantee", "seed"), [("at_least_once", 1), ("exactly_once", 2)])
def test_a_worker_scores_on_sasl_ssl_with_only_the_acls_seam_acls_grants(
        secured: Secured, granted: tuple[Topics, dict[str, str]], tmp_path: Path, guarantee: str, seed: int) -> None:
    topics, settings = granted
    worker = Worker(secured.bootstrap, secured.env("worker") | settings | {"SEAM_PROCESSING_GUARANTEE": guarantee},
                    tmp_path / "worker", free_port())
    try:
        worker.wait_ready()  # it declared its topics (its ACLs let it create them)
        records = transactions(300, seed=seed)
        # The operator may write the input (it replays dead letters there); nobody but the broker's admin
        # was granted a read of the predictions.
        asyncio.run(produce_raw(secured.connection("operator"), topics.input, records))
        ids = {str(orjson.loads(value)["id"]) for _key, value in records}
        out = asyncio.run(collect(secured.connection("admin"), [topics.predictions],
                                  lambda o: {p["id"] for p in o[topics.predictions]} >= ids,
                                  timeout_s=90, read_committed=True))
        assert {p["id"] for p in out[topics.predictions]} >= ids
        views = [worker.get(path)[1].decode() for path in ("/metrics", "/model/", "/cluster/", "/ready/")]
    finally:
        worker.stop()
    assert worker.proc.returncode == 0, worker.log_tail()
    assert_no_secret(secured, [tmp_path], views)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_sigkill_loses_nothing_with_only_the_acls_seam_acls_grants(
        secured: Secured, tmp_path: Path, unique: str, guarantee: str) -> None:
    """test_kill's check on this broker: the replacement worker restores, fences and commits with its ACLs."""
    settings = settings_for(unique)
    grant(secured, settings)
    topics = Topics.unique(unique)
    prepare_topics(secured.connection("admin"), topics)
    sigkills_lose_nothing(secured.connection("admin"), secured.connection("operator"), topics,
                          secured.env("worker") | settings, tmp_path, guarantee, total=3_000, kills=1, chunk=300)
    assert_no_secret(secured, [tmp_path])


def test_the_intruder_can_deploy_write_and_read_nothing_and_the_operator_deploys(
        secured: Secured, granted: tuple[Topics, dict[str, str]], tmp_path: Path) -> None:
    topics, settings = granted
    model = str(ROOT / "models" / "fraud-mlp.onnx")
    deployed = seam(secured.env("operator") | settings, "model", "deploy", model)
    assert deployed.returncode == 0, deployed.stderr
    assert "written to" in deployed.stdout

    refused = seam(secured.env("intruder") | settings, "model", "deploy", model)
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refused user 'intruder'" in lines[0] and "not authorized" in lines[0], lines

    async def intruder() -> list[str]:
        outcomes = []
        producer = AIOKafkaProducer(**client_options(secured.connection("intruder")))
        await producer.start()
        try:
            await producer.send_and_wait(topics.input, b"{}")
            outcomes.append("wrote the input")
        except TopicAuthorizationFailedError:
            outcomes.append("write refused")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topics.predictions, **client_options(secured.connection("intruder")),
                                    group_id=topics.app_id, enable_auto_commit=False)
        try:
            await consumer.start()
            await consumer.getmany(timeout_ms=5_000)
            outcomes.append("read the predictions")
        except TopicAuthorizationFailedError:
            outcomes.append("read refused")
        finally:
            await consumer.stop()
        return outcomes

    assert asyncio.run(intruder()) == ["write refused", "read refused"]
    assert_no_secret(secured, [tmp_path], [deployed.stdout, deployed.stderr, refused.stdout, refused.stderr])


def test_a_wrong_password_stops_the_worker_at_start_naming_the_setting(
        secured: Secured, tmp_path: Path, unique: str) -> None:
    env = secured.env("worker", password="not-" + secured.passwords["worker"]) | settings_for(unique)
    started = time.monotonic()
    worker = Worker(secured.bootstrap, env, tmp_path / "worker", free_port())
    try:
        returncode = worker.proc.wait(timeout=60)
    finally:
        worker.stop()
    assert returncode != 0
    assert time.monotonic() - started < 45  # at start, not after a session or request timeout
    log = worker.log_tail()
    assert "refused user 'worker'" in log and "SEAM_SASL_PASSWORD" in log, log
    assert_no_secret(secured, [tmp_path])


def assert_no_secret(secured: Secured, folders: list[Path], texts: Sequence[str] = ()) -> None:
    """No password appears in anything the run wrote: logs, data folders, command output, web views."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.endswith(".password"):
                data = path.read_bytes()
                found += [f"{path} holds {user}'s password" for user, password in secured.passwords.items()
                          if password.encode() in data or ("not-" + password).encode() in data]
    for text in texts:
        found += [f"output holds {user}'s password" for user, password in secured.passwords.items() if password in text]
    assert not found, found

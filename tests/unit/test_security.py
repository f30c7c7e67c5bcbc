"""Security settings: one connection for every Kafka client, secrets from files and never shown, the ACL set."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from app.acls import Acl, Grant, acls, commands, grants
from app.settings import Settings, SettingsError
from tables.kafka import Connection, client_options

SASL = {"SEAM_SECURITY_PROTOCOL": "SASL_SSL", "SEAM_SASL_MECHANISM": "SCRAM-SHA-512", "SEAM_SASL_USERNAME": "seam"}


def test_a_secret_comes_from_its_file_and_never_shows(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cr3t-value\n")  # as a mounted secret: with its newline
    settings = Settings.from_env(SASL | {"SEAM_SASL_PASSWORD_FILE": str(secret)})
    assert settings.sasl_password == "s3cr3t-value"
    assert settings.kafka.password == "s3cr3t-value"
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in repr(settings.kafka)


def test_a_secret_set_twice_or_unreadable_is_refused_by_name(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("x")
    with pytest.raises(SettingsError, match="SEAM_SASL_PASSWORD or SEAM_SASL_PASSWORD_FILE"):
        Settings.from_env(SASL | {"SEAM_SASL_PASSWORD": "x", "SEAM_SASL_PASSWORD_FILE": str(secret)})
    with pytest.raises(SettingsError, match="SEAM_SASL_PASSWORD_FILE: cannot read"):
        Settings.from_env(SASL | {"SEAM_SASL_PASSWORD_FILE": str(tmp_path / "missing")})


def test_sasl_needs_its_mechanism_user_and_password_and_plaintext_takes_none() -> None:
    with pytest.raises(SettingsError, match="SEAM_SASL_MECHANISM"):
        Settings.from_env({"SEAM_SECURITY_PROTOCOL": "SASL_SSL", "SEAM_SASL_USERNAME": "a", "SEAM_SASL_PASSWORD": "b"})
    with pytest.raises(SettingsError, match="SEAM_SASL_PASSWORD"):
        Settings.from_env(SASL)
    with pytest.raises(SettingsError, match="uses no SASL"):
        Settings.from_env({"SEAM_SASL_USERNAME": "a"})
    with pytest.raises(SettingsError, match="SEAM_SECURITY_PROTOCOL must be one of"):
        Settings.from_env({"SEAM_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(SettingsError, match="SEAM_SSL_CA_FILE: no such file"):
        Settings.from_env({"SEAM_SECURITY_PROTOCOL": "SSL", "SEAM_SSL_CA_FILE": "/nonexistent/ca.pem"})


def test_every_client_gets_the_same_connection_options() -> None:
    plain = client_options("127.0.0.1:9092", acks="all")
    assert plain == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT", "acks": "all"}
    secured = Settings.from_env(SASL | {"SEAM_SASL_PASSWORD": "pw", "SEAM_BROKER_URL": "kafka://k1:9093;kafka://k2:9093"})
    options = client_options(secured.kafka)
    assert options["bootstrap_servers"] == "k1:9093,k2:9093"
    assert (options["security_protocol"], options["sasl_mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("seam", "pw")
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ValueError, match="both a certificate file and its key file"):
        Connection("k:9093", "SSL", cert_file="client.pem")


def test_only_the_operator_may_write_the_control_topic() -> None:
    settings = Settings(app_id="shop", model_control_topic="ctl")
    granted = acls(settings, worker="User:w", operator="User:o")
    writes = {(a.principal, a.name) for a in granted if a.resource == "topic" and "Write" in a.operations}
    assert ("User:o", "ctl") in writes and ("User:w", "ctl") not in writes
    assert ("User:w", settings.predictions_topic) in writes and ("User:w", settings.input_topic) not in writes
    prefixed = {(a.resource, a.name) for a in granted if a.pattern == "prefixed"}
    assert {("topic", "shop-"), ("transactional-id", f"shop-{settings.input_topic}-"),
            ("group", "shop-dlq-replay-")} <= prefixed
    lines = commands(settings, worker="User:w", operator="User:o", command_config="/etc/kafka/admin.properties")
    assert len(lines) == len(grants(granted))
    assert all(line.startswith("kafka-acls --bootstrap-server 127.0.0.1:9092 --command-config "
                               "/etc/kafka/admin.properties --add --allow-principal User:") for line in lines)


def expanded(granted: list[Acl]) -> set[tuple[str, str, str, str, str]]:
    return {(a.principal, a.resource, a.name, a.pattern, operation) for a in granted for operation in a.operations}


def test_grants_add_exactly_the_acl_set_in_fewer_commands() -> None:
    settings = Settings(app_id="shop", model_control_topic="ctl", feature_log_topic="feat")
    granted = acls(settings, worker="User:w", operator="User:o")
    grouped = grants(granted)
    # kafka-acls adds each of a command's principals each of its operations on each of its resources.
    assert expanded([acl for grant in grouped for acl in grant.acls()]) == expanded(granted)
    assert len(grouped) == 10 < len(granted) == 16
    outputs = (settings.predictions_topic, settings.dlq_topic, settings.late_topic, settings.shadow_topic, "feat")
    assert Grant(("User:w",), "topic", outputs, ("Write", "Describe", "Create")) in grouped
    assert Grant(("User:w",), "topic", (settings.input_topic, "ctl"), ("Read", "Describe", "Create")) in grouped
    assert Grant(("User:w", "User:o"), "cluster", ("kafka-cluster",), ("IdempotentWrite",)) in grouped
    # Never a product that is not the set: same names and pattern, other operations, stay apart.
    assert Grant(("User:o",), "topic", ("ctl",), ("Read", "Write", "Describe", "Create")) in grouped
    assert Grant(("User:w",), "topic", ("shop-",), ("Read", "Write", "Describe", "Create"), "prefixed") in grouped
    assert Grant(("User:o",), "group", ("shop-dlq-replay-",), ("Read", "Describe"), "prefixed") in grouped
    assert Grant(("User:w",), "group", ("shop",), ("Read", "Describe")) in grouped


def test_a_grant_is_one_kafka_acls_command() -> None:
    grant = Grant(("User:w", "User:o"), "topic", ("a", "b"), ("Read", "Describe"), "prefixed")
    assert grant.args() == ["--add", "--allow-principal", "User:w", "--allow-principal", "User:o",
                            "--operation", "Read", "--operation", "Describe", "--topic", "a", "--topic", "b",
                            "--resource-pattern-type", "prefixed"]
    assert Grant(("User:w",), "cluster", ("kafka-cluster",), ("IdempotentWrite",)).args() == [
        "--add", "--allow-principal", "User:w", "--operation", "IdempotentWrite", "--cluster"]
    assert Grant(("User:w",), "transactional-id", ("t",), ("Write",)).args()[-2:] == ["--transactional-id", "t"]
    # One principal given the same operations on a name twice: one resource, not two.
    assert grants([Acl("User:w", "topic", "a", ("Read",)), Acl("User:w", "topic", "a", ("Read",))]) == [
        Grant(("User:w",), "topic", ("a",), ("Read",))]

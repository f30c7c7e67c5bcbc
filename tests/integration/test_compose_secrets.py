"""The secured compose variant's secrets: a broker certificate for ``kafka`` that the CA signs, passwords that
open the keystore, the ACL commands for the workers' settings, modes the containers can read, kept once made."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("keytool") is None, reason="keytool (a Java runtime) is not installed")]

SCRIPT = ROOT / "scripts" / "compose_secrets.py"


def make(folder: Path) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(folder)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_secrets_are_made_once_and_fit_the_compose_variant(tmp_path: Path) -> None:
    folder = tmp_path / "compose"
    assert "made" in make(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()}
    mounted = {"ca.pem", "broker.p12", "truststore.p12", "store.password", "admin.password", "seam.password",
               "operator.password", "acls.txt"}
    assert mounted <= set(modes)
    assert all(modes[name] == 0o644 for name in mounted)
    assert modes["ca.p12"] == 0o600  # the CA's key: no container mounts it

    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    store_password = (folder / "store.password").read_bytes()
    _key, broker, _chain = pkcs12.load_key_and_certificates((folder / "broker.p12").read_bytes(), store_password)
    assert broker is not None
    broker.verify_directly_issued_by(ca)
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kafka" in names.get_values_for_type(x509.DNSName)

    lines = (folder / "acls.txt").read_text().splitlines()
    assert lines and all(line.startswith("kafka-acls --bootstrap-server kafka:9092 --command-config "
                                         "/var/lib/kafka/data/secure/admin.properties --add ") for line in lines)
    assert any("--allow-principal User:seam" in line and "--group seam" in line for line in lines)
    assert any("--allow-principal User:operator" in line and "--topic model-deployments" in line
               and "Write" in line for line in lines)
    assert not any("User:seam" in line and "--topic model-deployments" in line and "Write" in line
                   for line in lines)  # only the operator deploys models

    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert "all there, kept" in make(folder)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before

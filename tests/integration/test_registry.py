"""The schema registry the project builds and starts (scripts/registry_local.py): the Confluent-compatible API
seam's Avro topics rely on, and its compatibility check on a schema's evolution."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration

CONTENT = "application/vnd.schemaregistry.v1+json"


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CONTENT})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def transaction_schema(*extra: dict[str, Any]) -> str:
    fields = [{"name": "id", "type": "string"}, {"name": "card_id", "type": "string"},
              {"name": "ts", "type": "long"}, {"name": "amount", "type": "double"},
              {"name": "merchant_id", "type": "string"}, *extra]
    return json.dumps({"type": "record", "name": "Transaction", "namespace": "seam", "fields": fields})


def test_schemas_register_by_subject_and_only_compatible_versions_are_accepted(schema_registry: str) -> None:
    subject = f"tx-{uuid.uuid4().hex[:8]}-value"
    v1 = transaction_schema()
    status, registered = call(f"{schema_registry}/subjects/{subject}/versions", "POST", {"schema": v1})
    assert status == 200 and isinstance(registered["id"], int), registered
    assert call(f"{schema_registry}/schemas/ids/{registered['id']}")[1]["schema"] == v1
    assert call(f"{schema_registry}/config/{subject}", "PUT", {"compatibility": "BACKWARD"}) == (
        200, {"compatibility": "BACKWARD"})
    # A field added with a default: readers of the new version still read records written with the old one.
    v2 = transaction_schema({"name": "country", "type": "string", "default": ""})
    status, second = call(f"{schema_registry}/subjects/{subject}/versions", "POST", {"schema": v2})
    assert status == 200 and second["id"] != registered["id"], second
    # A field added without a default breaks them: the registry refuses it.
    v3 = transaction_schema({"name": "channel", "type": "string"})
    status, refused = call(f"{schema_registry}/subjects/{subject}/versions", "POST", {"schema": v3})
    assert status == 409, (status, refused)
    assert call(f"{schema_registry}/subjects/{subject}/versions")[1] == [1, 2]
    status, latest = call(f"{schema_registry}/subjects/{subject}/versions/latest")
    assert status == 200 and latest["version"] == 2 and latest["id"] == second["id"]

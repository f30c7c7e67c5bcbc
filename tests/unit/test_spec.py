"""Feature specs: parsing, the checks with errors that say what and where, and `seam spec check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models import EXAMPLE_MODEL
from specs import EXAMPLE_SPEC, SPECS
from tables.features import DEFAULT_SPEC
from tables.spec import (
    OPERATIONS,
    SpecError,
    describe,
    format_duration,
    layout_change,
    load_spec,
    parse_duration_ms,
    parse_spec,
)

HEAD = """\
name = "t"
key = "device_id"
event_id = "reading_id"
event_time = "ts"
allowed_lateness = "30s"

[fields]
temperature = { type = "float", min = -100.0, max = 200.0 }
site = { type = "string", max_chars = 16 }
door_open = { type = "bool", optional = true, default = false }
"""


def spec_with(*features: str, head: str = HEAD) -> str:
    return head + "".join(f"\n[[features]]\n{feature.strip()}\n" for feature in features)


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as raised:
        parse_spec(text, source="t.toml")
    return str(raised.value)


def test_the_example_spec_is_the_default_and_has_the_fraud_features_in_model_order() -> None:
    spec = load_spec(EXAMPLE_SPEC)
    assert spec == DEFAULT_SPEC
    assert spec.names == (
        "count_60", "amount_sum_60", "amount_mean_60", "amount_max_60",
        "count_600", "amount_sum_600", "amount_mean_600", "amount_max_600",
        "count_3600", "amount_sum_3600", "amount_mean_3600", "amount_max_3600",
        "secs_since_prev", "distinct_merchants_3600", "amount_to_mean_3600")
    assert (spec.key, spec.event_id, spec.event_time, spec.time_format) == ("card_id", "id", "ts", "epoch_ms")
    assert spec.stored == ("amount", "merchant_id") and spec.max_window_ms == 3_600_000
    assert spec.allowed_lateness_ms == 60_000
    assert spec.replay_allowance_ms == 600_000 and spec.horizon_ms == 60_000 + 600_000 + 3_600_000
    assert spec.version == "15-91af4c74911f"  # the feature log's records carry it: it must not drift


def test_every_shipped_spec_parses() -> None:
    for path in sorted(SPECS.glob("*.toml")):
        assert load_spec(path).names, path


def test_every_operation_parses_with_what_it_needs() -> None:
    text = spec_with(*(f'name = "f_{op.name}"\nop = "{op.name}"'
                       + ('\nfield = "temperature"' if op.field_types is not None else "")
                       + ('\nwindow = "90s"' if op.windowed else "") for op in OPERATIONS.values()))
    spec = parse_spec(text)
    assert [f.op for f in spec.features] == list(OPERATIONS)
    assert {f.window_ms for f in spec.features if f.window_ms} == {90_000}
    assert spec.stored == ("temperature",)
    assert [f.default for f in spec.features if f.op in ("last", "since_prev")] == [0.0, -1.0]


def test_fields_keep_types_bounds_and_defaults() -> None:
    spec = parse_spec(spec_with('name = "n"\nop = "distinct"\nfield = "site"\nwindow = "1m"',
                                'name = "d"\nop = "mean"\nfield = "door_open"\nwindow = "10m"'))
    temperature, site, door = spec.fields
    assert (temperature.type, temperature.min, temperature.max, temperature.optional) == ("float", -100.0, 200.0, False)
    assert (site.type, site.max_chars) == ("string", 16)
    assert (door.type, door.optional, door.default) == ("bool", True, False)
    assert spec.stored == ("site", "door_open")


@pytest.mark.parametrize(("text", "ms"), [("500ms", 500), ("60s", 60_000), ("10m", 600_000), ("1h", 3_600_000),
                                          ("2d", 172_800_000), (" 7 s ", 7_000), ("0s", 0)])
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["60", "1.5h", "1hr", "-5s", "", "s", 60])
def test_durations_that_are_not(text: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms(text)


def test_format_duration() -> None:
    assert [format_duration(ms) for ms in (60_000, 90_000, 3_600_000, 7_260_000, 1_500, 0)] == [
        "1m", "90s", "1h", "121m", "1500ms", "0ms"]


# Each: a spec with one thing wrong, and what the error must say (the feature or field, and the line).
MISTAKES = [
    (spec_with('name = "a"\nop = "meen"\nfield = "temperature"\nwindow = "1m"'),
     ["feature 'a'", "unknown op 'meen'", "line 13", "mean"]),
    (spec_with('name = "a"\nop = "mean"\nfield = "temprature"\nwindow = "1m"'),
     ["feature 'a'", "field 'temprature' is not declared", "temperature", "line 13"]),
    (spec_with('name = "a"\nop = "mean"\nfield = "temperature"'), ["feature 'a'", "needs a window"]),
    (spec_with('name = "a"\nop = "mean"\nfield = "temperature"\nwindow = "1 hour"'),
     ["feature 'a'", "'window'", "not a duration"]),
    (spec_with('name = "a"\nop = "count"'), ["feature 'a'", "count needs a window"]),
    (spec_with('name = "a"\nop = "mean"\nwindow = "1m"'), ["feature 'a'", "mean needs a field"]),
    (spec_with('name = "a"\nop = "since_prev"\nwindow = "1m"'), ["feature 'a'", "since_prev takes no window"]),
    (spec_with('name = "a"\nop = "count"\nfield = "site"\nwindow = "1m"'), ["feature 'a'", "count takes no field"]),
    (spec_with('name = "a"\nop = "sum"\nfield = "site"\nwindow = "1m"'),
     ["feature 'a'", "needs a numeric field", "'site' is a string"]),
    (spec_with('name = "a"\nop = "count"\nwindow = "1m"', 'name = "a"\nop = "count"\nwindow = "2m"'),
     ["feature 'a' is declared twice", "line 13"]),
    (spec_with('name = "bad-name"\nop = "count"\nwindow = "1m"'), ["feature 'bad-name'", "letters, digits and _"]),
    (spec_with('op = "count"\nwindow = "1m"'), ["feature #1", "'name'", "line 12"]),
    (spec_with('name = "a"\nop = "count"\nwindow = "1m"\nwindwo = "2m"'), ["feature 'a'", "unknown setting 'windwo'"]),
    (spec_with('name = "a"\nop = "count"\nwindow = "1m"\ndefault = 3'), ["feature 'a'", "count takes no default"]),
    (spec_with('name = "a"\nop = "count"\nwindow = "0s"'), ["feature 'a'", "longer than 0"]),
    (spec_with(head=HEAD.replace('site = { type = "string", max_chars = 16 }', 'site = { type = "str" }')),
     ["field 'site'", "'type' must be one of float, int, string, bool", "line 9"]),
    (HEAD.replace("min = -100.0, max = 200.0", "min = 300.0, max = 200.0") + '[[features]]\nname="a"\nop="count"\n'
     'window="1m"\n', ["field 'temperature'", "min 300.0 is above max 200.0", "line 8"]),
    (HEAD.replace("optional = true, default = false", "default = false") + '[[features]]\nname="a"\nop="count"\n'
     'window="1m"\n', ["field 'door_open'", "a default is for an optional field"]),
    (HEAD.replace('door_open = { type = "bool", optional = true, default = false }',
                  'door_open = { type = "bool", optional = true }')
     + '[[features]]\nname="a"\nop="sum"\nfield="door_open"\nwindow="1m"\n',
     ["feature 'a'", "'door_open' is optional and has no default"]),
    (HEAD.replace('site = { type = "string", max_chars = 16 }', 'ts = { type = "int" }')
     + '[[features]]\nname="a"\nop="count"\nwindow="1m"\n', ["field 'ts' is the spec's event_time"]),
    (HEAD.replace('key = "device_id"', 'key = "ts"') + '[[features]]\nname="a"\nop="count"\nwindow="1m"\n',
     ["three different fields"]),
    (HEAD.replace('key = "device_id"\n', "") + '[[features]]\nname="a"\nop="count"\nwindow="1m"\n',
     ["'key' must name the input field"]),
    (HEAD.replace('allowed_lateness = "30s"', 'allowed_lateness = 30'), ["'allowed_lateness'", "line 5"]),
    (HEAD.replace('allowed_lateness = "30s"', 'allowed_lateness = "30s"\nreplay_allowance = "ten minutes"')
     + '[[features]]\nname="a"\nop="count"\nwindow="1m"\n', ["'replay_allowance'", "line 6", "not a duration"]),
    (HEAD.replace('name = "t"', 'name = "t"\nwindows = 3') + '[[features]]\nname="a"\nop="count"\nwindow="1m"\n',
     ["unknown setting 'windows'", "line 2"]),
    (HEAD, ["declares its features"]),
    (HEAD + "[[features]\nname = 'a'\n", ["not valid TOML", "at line 11"]),
]


@pytest.mark.parametrize(("text", "says"), MISTAKES, ids=[says[0] for _, says in MISTAKES])
def test_a_mistake_is_named_with_its_line(text: str, says: list[str]) -> None:
    message = error_of(text)
    assert message.startswith("t.toml"), message
    for part in says:
        assert part in message, f"{part!r} not in {message!r}"


def test_the_replay_allowance_sets_the_replay_horizon_and_what_state_keeps() -> None:
    """Redeliveries are scored as the first time within lateness + the allowance; the state keeps that and the
    longest window. Undeclared, the allowance is the longest window. A state recorded with a shorter reach
    cannot serve a longer allowance (its redeliveries' windows were evicted); a shorter one it can."""
    features = 'name = "a"\nop = "count"\nwindow = "10m"', 'name = "b"\nop = "last"\nfield = "temperature"'
    undeclared = parse_spec(spec_with(*features))
    assert undeclared.replay_allowance_ms == 600_000
    assert (undeclared.replay_horizon_ms, undeclared.horizon_ms) == (30_000 + 600_000, 30_000 + 1_200_000)
    declared = parse_spec(spec_with(*features, head=HEAD.replace('allowed_lateness = "30s"',
                                                                 'allowed_lateness = "30s"\nreplay_allowance = "90s"')))
    assert declared.replay_allowance_ms == 90_000
    assert (declared.replay_horizon_ms, declared.horizon_ms) == (30_000 + 90_000, 30_000 + 90_000 + 600_000)
    assert layout_change(undeclared.layout, declared) is None
    refused = layout_change(declared.layout, undeclared)
    assert refused is not None and "reaches back 1230s" in refused and "the state holds 12m" in refused, refused


def test_describe_lists_the_features_in_model_order() -> None:
    text = describe(DEFAULT_SPEC)
    assert "15 features per card_id" in text and "keeps 71m of its events" in text
    assert "redeliveries scored as the first time up to 11m below their key's newest event" in text
    lines = text.splitlines()[1:]
    assert [line.split()[1] for line in lines] == list(DEFAULT_SPEC.names)
    assert "ratio_to_mean of amount over 1h" in lines[-1]


def seam(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("seam")  # the console script, as users run it
    return subprocess.run([str(command), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_seam_spec_check_accepts_the_example_and_its_model(tmp_path: Path) -> None:
    done = seam("spec", "check", str(EXAMPLE_SPEC), str(EXAMPLE_MODEL), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "15 features per card_id" in done.stdout
    assert "takes these 15 features, in this order" in done.stdout


def test_seam_spec_check_names_the_mistake_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text(spec_with('name = "a"\nop = "mean"\nfield = "temprature"\nwindow = "1m"'))
    done = seam("spec", "check", str(path), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"seam spec check: {path}, line 13: feature 'a': field 'temprature' is not declared; the fields are "
        "temperature, site, door_open")
    assert "Traceback" not in done.stderr


def test_seam_spec_check_refuses_a_model_whose_features_differ(tmp_path: Path) -> None:
    path = tmp_path / "other.toml"
    path.write_text(spec_with('name = "temp_mean"\nop = "mean"\nfield = "temperature"\nwindow = "1m"'))
    done = seam("spec", "check", str(path), str(EXAMPLE_MODEL), cwd=tmp_path)
    assert done.returncode == 1
    assert f"model {EXAMPLE_MODEL} does not fit {path}" in done.stderr and "Traceback" not in done.stderr

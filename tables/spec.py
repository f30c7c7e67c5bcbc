"""A feature spec: the stream a worker reads and the features it computes, declared in a TOML file (pure code).

A spec names the entity key (state is kept per key, and it is the records' Kafka key), the event id
and the event time, the input fields with their types and bounds, the allowed lateness, how far
back a redelivery is still scored as the first time (the replay allowance), and the features in model
order. Each feature is an operation, over an input field where the operation
needs one, and over a window where it needs one::

    name = "sensors"
    key = "device_id"
    event_id = "reading_id"
    event_time = "ts"
    allowed_lateness = "30s"
    replay_allowance = "5m"

    [fields]
    temperature = { type = "float", min = -100.0, max = 200.0 }

    [[features]]
    name = "temp_mean_60s"
    op = "mean"
    field = "temperature"
    window = "60s"

Every operation has the point-in-time meaning of seam's features: over the events of this key that
arrived no later than this one (itself included), with event time in ``(ts - W, ts]``
(:data:`OPERATIONS`; ``tables.features`` computes them). :func:`load_spec` reads a file and
:func:`parse_spec` a text; both raise :class:`SpecError`, whose message names the feature or field
that is wrong and, where it can be found, the line.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["OPERATIONS", "Feature", "FeatureSpec", "Field", "Operation", "SpecError", "describe", "feature_set_version",
           "format_duration",
           "check_value", "layout_change", "load_spec", "parse_duration_ms", "parse_spec"]

FIELD_TYPES = ("float", "int", "string", "bool")
NUMERIC = frozenset({"float", "int", "bool"})  # what aggregates read as numbers (a bool as 0.0 or 1.0)
TIME_FORMATS = ("epoch_ms", "iso8601")
MAX_ID_CHARS = 128  # the key and the event id: 1..128 characters
MAX_EXACT_INT = 2 ** 53  # an int field's default bound: every value is exact as a float
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a feature's or field's name: also an Avro field name
_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|h|d)\s*\Z")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class SpecError(ValueError):
    """A spec that cannot be used: the message says what is wrong and where."""


@dataclass(frozen=True, slots=True)
class Operation:
    """What a feature operation needs: an input field (of which types), a window."""

    name: str
    doc: str
    field_types: frozenset[str] | None  # None: takes no field
    windowed: bool
    default: float | None = None  # the value when there is nothing to compute from (last, since_prev)


OPERATIONS: dict[str, Operation] = {op.name: op for op in (
    Operation("count", "the number of events in the window", None, True),
    Operation("sum", "the field's sum over the window, correctly rounded", NUMERIC, True),
    Operation("mean", "the window's sum divided by its count", NUMERIC, True),
    Operation("min", "the field's smallest value in the window", NUMERIC, True),
    Operation("max", "the field's largest value in the window", NUMERIC, True),
    Operation("std", "the population standard deviation of the field over the window (the exact variance, "
                     "rounded once, then its square root)", NUMERIC, True),
    Operation("distinct", "the exact number of distinct values of the field in the window",
              frozenset(FIELD_TYPES), True),
    Operation("last", "the field's value in the previous event (the latest at or before this one's time, of "
                      "those that arrived before it); default when there is none", NUMERIC, False, 0.0),
    Operation("since_prev", "seconds since the previous event; default when there is none", None, False, -1.0),
    Operation("ratio_to_mean", "the event's value divided by the field's mean over the window (0 when the mean "
                               "is 0)", NUMERIC, True),
)}


@dataclass(frozen=True, slots=True)
class Field:
    """An input field: its type, whether it may be missing (then ``default`` stands in), and its bounds."""

    name: str
    type: str
    optional: bool = False
    default: Any = None
    min: float | None = None
    max: float | None = None
    max_chars: int = MAX_ID_CHARS

    @property
    def bounds(self) -> tuple[float, float]:
        """The closed range a number of this field must lie in, as :func:`check_value` holds it: a float's range
        (which leaves out NaN and the infinities), narrowed by ``min`` and ``max``."""
        low = -_FLOAT_MAX if self.min is None else max(-_FLOAT_MAX, self.min)
        return low, _FLOAT_MAX if self.max is None else min(_FLOAT_MAX, self.max)


@dataclass(frozen=True, slots=True)
class Feature:
    """One model input: an operation, over a field and a window where it needs them."""

    name: str
    op: str
    field: str | None = None
    window_ms: int | None = None
    default: float | None = None  # last and since_prev: the value when there is no previous event


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """A parsed, checked spec (see the module docstring). ``names`` are the features in model order."""

    name: str
    key: str
    event_id: str
    event_time: str
    fields: tuple[Field, ...]
    features: tuple[Feature, ...]
    allowed_lateness_ms: int
    time_format: str = "epoch_ms"
    label: str = "flagged"  # the predictions' boolean: score >= the worker's threshold
    avro_record: str = "Event"  # the name of the Avro input schema's record (what producers register)
    # How far a key's newest event may be past a redelivered one, beyond the allowed lateness, for the
    # redelivery to be scored again with its first features (a spec file's default: its longest window).
    replay_allowance_ms: int = 0
    names: tuple[str, ...] = field(init=False)
    stored: tuple[str, ...] = field(init=False)  # the fields a key's state keeps, per event (declaration order)
    max_window_ms: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(f.name for f in self.features))
        used = {f.field for f in self.features if f.field is not None}
        object.__setattr__(self, "stored", tuple(f.name for f in self.fields if f.name in used))
        windows = [f.window_ms for f in self.features if f.window_ms is not None]
        object.__setattr__(self, "max_window_ms", max(windows, default=0))

    @property
    def version(self) -> str:
        """Names the feature set (its names in order): the feature log's records carry it."""
        return feature_set_version(self.names)

    @property
    def replay_horizon_ms(self) -> int:
        """How far below its key's newest event a redelivery is still scored with its first features: the
        allowed lateness and the replay allowance. An older one goes to the late topic."""
        return self.allowed_lateness_ms + self.replay_allowance_ms

    @property
    def horizon_ms(self) -> int:
        """How far back in event time a key's state reaches: the replay horizon and the longest window (a
        redelivery at the replay horizon is scored from its window's events)."""
        return self.replay_horizon_ms + self.max_window_ms

    @property
    def layout(self) -> str:
        """What a key's stored state holds under this spec (JSON): its key field, its value columns in order,
        and its horizon. Each state partition records it; :func:`layout_change` compares a recorded one."""
        return json.dumps({"key": self.key, "fields": list(self.stored), "horizon_ms": self.horizon_ms},
                          sort_keys=True)

    def field(self, name: str) -> Field:
        """The input field called ``name``."""
        return next(f for f in self.fields if f.name == name)


def feature_set_version(names: tuple[str, ...]) -> str:
    """``<count>-<first 12 hex digits of SHA-256 of the comma-joined names>``: equal iff the names are."""
    return f"{len(names)}-{hashlib.sha256(','.join(names).encode()).hexdigest()[:12]}"


def parse_duration_ms(text: Any) -> int:
    """``"500ms"``, ``"60s"``, ``"10m"``, ``"1h"``, ``"2d"`` in milliseconds; ValueError otherwise."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a duration: a whole number and a unit (ms, s, m, h, d), such as \"60s\"")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def load_spec(path: str | Path) -> FeatureSpec:
    """Read and check the spec file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from exc
    return parse_spec(text, source=str(path))


def parse_spec(text: str, *, source: str = "<spec>") -> FeatureSpec:
    """Parse and check a spec's TOML text; ``source`` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}") from exc
    return _Reader(text, source).spec(doc)


class _Reader:
    """Turns a parsed TOML document into a FeatureSpec, with errors that say where."""

    TOP = ("name", "key", "event_id", "event_time", "time_format", "allowed_lateness", "replay_allowance", "label",
           "avro_record", "fields", "features")
    FIELD_KEYS = ("type", "optional", "default", "min", "max", "max_chars")
    FEATURE_KEYS = ("name", "op", "field", "window", "default")

    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source

    def fail(self, message: str, *patterns: str) -> SpecError:
        """An error naming the source and the first line matching one of ``patterns`` (regexes)."""
        for pattern in patterns:
            regex = re.compile(pattern)
            for number, line in enumerate(self.lines, 1):
                if regex.search(line.split("#", 1)[0]):
                    return SpecError(f"{self.source}, line {number}: {message}")
        return SpecError(f"{self.source}: {message}")

    def spec(self, doc: dict[str, Any]) -> FeatureSpec:
        for key in doc:
            if key not in self.TOP:
                raise self.fail(f"unknown setting {key!r} (a spec has {', '.join(self.TOP)})",
                                rf"^\s*{re.escape(key)}\s*=", rf"^\s*\[+\s*{re.escape(key)}\b")
        roles = {}
        for role in ("key", "event_id", "event_time"):
            value = doc.get(role)
            if not isinstance(value, str) or not _NAME.match(value):
                raise self.fail(f"{role!r} must name the input field that holds the {role.replace('_', ' ')} "
                                f"(letters, digits and _), got {value!r}", rf"^\s*{role}\s*=")
            roles[role] = value
        if len(set(roles.values())) < 3:
            raise self.fail(f"key, event_id and event_time must be three different fields, got {roles}",
                            r"^\s*event_time\s*=")
        name = doc.get("name", "spec")
        if not isinstance(name, str) or not name.strip():
            raise self.fail(f"'name' must be a non-empty string, got {name!r}", r"^\s*name\s*=")
        time_format = doc.get("time_format", "epoch_ms")
        if time_format not in TIME_FORMATS:
            raise self.fail(f"'time_format' must be one of {', '.join(TIME_FORMATS)}, got {time_format!r}",
                            r"^\s*time_format\s*=")
        try:
            lateness = parse_duration_ms(doc.get("allowed_lateness", "0s"))
        except ValueError as exc:
            raise self.fail(f"'allowed_lateness': {exc}", r"^\s*allowed_lateness\s*=") from None
        replay_allowance = None
        if "replay_allowance" in doc:
            try:
                replay_allowance = parse_duration_ms(doc["replay_allowance"])
            except ValueError as exc:
                raise self.fail(f"'replay_allowance': {exc}", r"^\s*replay_allowance\s*=") from None
        label = doc.get("label", "flagged")
        if not isinstance(label, str) or not _NAME.match(label) or label in roles.values() or label in (
                "score", "model", "timing"):
            raise self.fail(f"'label' names the predictions' field that says score >= threshold: letters, digits "
                            f"and _, not an input role or score, model, timing; got {label!r}", r"^\s*label\s*=")
        avro_record = doc.get("avro_record", "Event")
        if not isinstance(avro_record, str) or not _NAME.match(avro_record):
            raise self.fail(f"'avro_record' must be an Avro name (letters, digits and _), got {avro_record!r}",
                            r"^\s*avro_record\s*=")
        raw_fields = doc.get("fields", {})
        if not isinstance(raw_fields, dict):
            raise self.fail("'fields' must be a table of input fields: [fields] then name = { type = ... }",
                            r"^\s*fields\s*=")
        fields = tuple(self.input_field(name, value, roles) for name, value in raw_fields.items())
        raw_features = doc.get("features")
        if not isinstance(raw_features, list) or not raw_features:
            raise self.fail("a spec declares its features, in model order: one [[features]] table each "
                            "(name, op, and field and window where the op needs them)", r"^\s*features\s*=")
        by_name = {f.name: f for f in fields}
        features: list[Feature] = []
        for index, value in enumerate(raw_features):
            feature = self.feature(index, value, by_name)
            if feature.name in {f.name for f in features}:
                raise self.fail(f"feature {feature.name!r} is declared twice: feature names are the model's "
                                "input names and must be unique", *self.feature_lines(feature.name, index))
            features.append(feature)
        spec = FeatureSpec(name.strip(), roles["key"], roles["event_id"], roles["event_time"], fields,
                           tuple(features), lateness, time_format, label, avro_record)
        return replace(spec, replay_allowance_ms=spec.max_window_ms if replay_allowance is None else replay_allowance)

    def input_field(self, name: str, value: Any, roles: dict[str, str]) -> Field:
        where = (rf"^\s*\[\s*fields\.{re.escape(name)}\s*\]", rf"^\s*{re.escape(name)}\s*=")
        if not _NAME.match(name):
            raise self.fail(f"field {name!r}: a field's name has letters, digits and _ only", *where)
        if name in roles.values():
            raise self.fail(f"field {name!r} is the spec's {next(r for r, v in roles.items() if v == name)}: "
                            "it is read as such, do not declare it among the fields", *where)
        if not isinstance(value, dict):
            raise self.fail(f"field {name!r}: expected a table such as {{ type = \"float\" }}, got {value!r}",
                            *where)
        for key in value:
            if key not in self.FIELD_KEYS:
                raise self.fail(f"field {name!r}: unknown setting {key!r} (a field has "
                                f"{', '.join(self.FIELD_KEYS)})", *where)
        kind = value.get("type")
        if kind not in FIELD_TYPES:
            raise self.fail(f"field {name!r}: 'type' must be one of {', '.join(FIELD_TYPES)}, got {kind!r}", *where)
        optional = value.get("optional", False)
        if not isinstance(optional, bool):
            raise self.fail(f"field {name!r}: 'optional' must be true or false, got {optional!r}", *where)
        bounds: dict[str, float | None] = {}
        for bound in ("min", "max"):
            given = value.get(bound)
            if given is not None and (kind not in ("float", "int") or isinstance(given, bool)
                                      or not isinstance(given, int | float) or not math.isfinite(given)):
                raise self.fail(f"field {name!r}: {bound!r} must be a finite number, on a float or int field",
                                *where)
            bounds[bound] = given
        if kind == "int":
            bounds["min"] = -MAX_EXACT_INT if bounds["min"] is None else bounds["min"]
            bounds["max"] = MAX_EXACT_INT if bounds["max"] is None else bounds["max"]
        low, high = bounds["min"], bounds["max"]
        if low is not None and high is not None and low > high:
            raise self.fail(f"field {name!r}: min {low} is above max {high}", *where)
        max_chars = value.get("max_chars", MAX_ID_CHARS)
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 1 <= max_chars <= 65_536:
            raise self.fail(f"field {name!r}: 'max_chars' must be an integer from 1 to 65536", *where)
        default = value.get("default")
        if default is not None:
            if not optional:
                raise self.fail(f"field {name!r}: a default is for an optional field (optional = true)", *where)
            problem = check_value(Field(name, kind, False, None, low, high, max_chars), default)
            if problem is not None:
                raise self.fail(f"field {name!r}: its default {default!r} {problem[1]}", *where)
            if kind == "float":
                default = float(default)
        return Field(name, kind, optional, default, low, high, max_chars)

    def feature_lines(self, name: str | None, index: int) -> tuple[str, ...]:
        """Patterns for the line of feature ``name`` (its name = line), else of its [[features]] header."""
        patterns = [rf"\bname\s*=\s*[\"']{re.escape(name)}[\"']"] if name else []
        headers = [number for number, line in enumerate(self.lines) if re.match(r"\s*\[\[\s*features\s*\]\]", line)]
        if index < len(headers):
            patterns.append(rf"\A{re.escape(self.lines[headers[index]])}\Z")
        return tuple(patterns)

    def feature(self, index: int, value: Any, fields: dict[str, Field]) -> Feature:
        name = value.get("name") if isinstance(value, dict) else None
        label = f"feature {name!r}" if isinstance(name, str) else f"feature #{index + 1}"
        where = self.feature_lines(name if isinstance(name, str) else None, index)
        if not isinstance(value, dict):
            raise self.fail(f"{label}: expected a table (name, op, field, window), got {value!r}", *where)
        for key in value:
            if key not in self.FEATURE_KEYS:
                raise self.fail(f"{label}: unknown setting {key!r} (a feature has {', '.join(self.FEATURE_KEYS)})",
                                *where)
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.fail(f"{label}: 'name' must be letters, digits and _ (it is an input name of the model and "
                            f"an Avro field name), got {name!r}", *where)
        op_name = value.get("op")
        op = OPERATIONS.get(op_name) if isinstance(op_name, str) else None
        if op is None:
            raise self.fail(f"{label}: unknown op {op_name!r}; the ops are {', '.join(OPERATIONS)}", *where)
        field_name = value.get("field")
        if op.field_types is None:
            if field_name is not None:
                raise self.fail(f"{label}: {op.name} takes no field (it is {op.doc})", *where)
        else:
            if not isinstance(field_name, str):
                raise self.fail(f"{label}: {op.name} needs a field: field = \"<one of {', '.join(fields)}>\"",
                                *where)
            declared = fields.get(field_name)
            if declared is None:
                raise self.fail(f"{label}: field {field_name!r} is not declared; the fields are "
                                f"{', '.join(fields) or 'none'}", *where)
            if declared.type not in op.field_types:
                raise self.fail(f"{label}: {op.name} needs a numeric field (float, int or bool); "
                                f"{field_name!r} is a {declared.type}", *where)
            if declared.optional and declared.default is None:
                raise self.fail(f"{label}: field {field_name!r} is optional and has no default, so {op.name} "
                                "would have nothing to read when it is missing: give the field a default", *where)
        window = value.get("window")
        window_ms = None
        if op.windowed:
            if window is None:
                raise self.fail(f"{label}: {op.name} needs a window, such as window = \"10m\"", *where)
            try:
                window_ms = parse_duration_ms(window)
            except ValueError as exc:
                raise self.fail(f"{label}: 'window': {exc}", *where) from None
            if window_ms <= 0:
                raise self.fail(f"{label}: the window must be longer than 0", *where)
        elif window is not None:
            raise self.fail(f"{label}: {op.name} takes no window (it is {op.doc})", *where)
        default = value.get("default", op.default)
        if op.default is None and "default" in value:
            raise self.fail(f"{label}: {op.name} takes no default", *where)
        if default is not None and (isinstance(default, bool) or not isinstance(default, int | float)
                                    or not math.isfinite(default)):
            raise self.fail(f"{label}: 'default' must be a finite number, got {default!r}", *where)
        return Feature(name, op.name, field_name if op.field_types is not None else None, window_ms,
                       None if default is None else float(default))


def check_value(spec_field: Field, value: Any) -> tuple[str, str] | None:
    """Why ``value`` does not fit ``spec_field`` (its type and bounds): a (reason, message) pair, or None when it does.

    The reasons are dead-letter reasons: ``wrong_type``, ``out_of_range``, ``not_finite``.
    """
    kind = spec_field.type
    if kind == "string":
        if not isinstance(value, str):
            return "wrong_type", f"must be a string, got {type(value).__name__}"
        if not 0 < len(value) <= spec_field.max_chars:
            return "out_of_range", f"must have 1..{spec_field.max_chars} characters"
        return None
    if kind == "bool":
        return None if isinstance(value, bool) else ("wrong_type", f"must be true or false, got {type(value).__name__}")
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind == "int" and not isinstance(value, int)):
        return "wrong_type", f"must be {'an integer' if kind == 'int' else 'a number'}, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return "not_finite", f"must be finite, got {value}"
    if not -_FLOAT_MAX <= value <= _FLOAT_MAX:  # an integer too large to be a float
        return "out_of_range", f"an integer of {int(value).bit_length()} bits is out of a float's range"
    if spec_field.min is not None and value < spec_field.min:
        return "out_of_range", f"{value} is below its minimum {spec_field.min:g}"
    if spec_field.max is not None and value > spec_field.max:
        return "out_of_range", f"{value} is above its maximum {spec_field.max:g}"
    return None


_FLOAT_MAX = 1.7976931348623157e308


def format_duration(ms: int) -> str:
    """``ms`` in the largest unit that divides it: ``3600000`` -> ``"1h"``, ``90000`` -> ``"90s"``."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def describe(spec: FeatureSpec) -> str:
    """A spec for people: what it reads, how long a key's state reaches back, then each feature in model order."""
    lines = [f"spec {spec.name!r}: {len(spec.features)} features per {spec.key} (event id {spec.event_id}, "
             f"event time {spec.event_time} as {spec.time_format}); allowed lateness "
             f"{format_duration(spec.allowed_lateness_ms)}; redeliveries scored as the first time up to "
             f"{format_duration(spec.replay_horizon_ms)} below their key's newest event; a key's state keeps "
             f"{format_duration(spec.horizon_ms)} of its events ({', '.join(spec.stored) or 'times only'})"]
    width = max(len(name) for name in spec.names)
    for number, feature in enumerate(spec.features, 1):
        over = f" of {feature.field}" if feature.field else ""
        window = f" over {format_duration(feature.window_ms)}" if feature.window_ms else ""
        default = f" (default {feature.default:g})" if feature.default is not None else ""
        lines.append(f"  {number:>3}  {feature.name:<{width}}  {feature.op}{over}{window}{default}")
    return "\n".join(lines)


def layout_change(recorded: str, spec: FeatureSpec) -> str | None:
    """Why state recorded with layout ``recorded`` cannot serve ``spec`` (None: it can, as it is).

    The state can serve a spec that keys by the same field, keeps the same fields, and reaches back no
    further than the state does: features may be added, removed or reordered over those fields, and
    windows, the lateness or the replay allowance may shrink. Anything else would compute features from
    history the state does not hold, or from the wrong columns.
    """
    try:
        held = json.loads(recorded)
        key, fields, horizon = held["key"], list(held["fields"]), int(held["horizon_ms"])
    except (ValueError, KeyError, TypeError):
        return f"the state's layout record is unreadable: {recorded[:200]!r}"
    advice = ("start the workers with a new SEAM_APP_ID (state is then rebuilt from the input topic's retained "
              "events), or go back to the spec the state was built with")
    if key != spec.key:
        return f"the state is keyed by {key!r} and the spec by {spec.key!r}: {advice}"
    if fields != list(spec.stored):
        added = [name for name in spec.stored if name not in fields]
        if added:
            return (f"the spec's features read {', '.join(added)}, which the state does not keep (it keeps "
                    f"{', '.join(fields) or 'no field'}): their history is not there; {advice}")
        return (f"the state keeps the fields {', '.join(fields)} and the spec reads {', '.join(spec.stored) or 'none'}"
                f": a state keeps the fields it was built with; {advice}")
    if spec.horizon_ms > horizon:
        return (f"the spec reaches back {format_duration(spec.horizon_ms)} (allowed lateness, replay allowance and "
                f"longest window) but the state holds {format_duration(horizon)}: windows reaching further back would "
                f"miss events; {advice}")
    return None

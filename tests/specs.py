"""Specs for tests: the example spec's feature shapes over other windows, written as a spec file would be."""

from __future__ import annotations

from tables.spec import FeatureSpec, parse_spec

_HEAD = """
name = "fraud-like"
key = "card_id"
event_id = "id"
event_time = "ts"
allowed_lateness = "{lateness_s}s"

[fields]
amount = {{ type = "float", min = -1e12, max = 1e12 }}
merchant_id = {{ type = "string" }}
"""


def _feature(name: str, op: str, field: str | None = None, window_s: int | None = None) -> str:
    lines = [f'\n[[features]]\nname = "{name}"\nop = "{op}"\n']
    if field is not None:
        lines.append(f'field = "{field}"\n')
    if window_s is not None:
        lines.append(f'window = "{window_s}s"\n')
    return "".join(lines)


def fraud_like(windows_s: tuple[int, ...], distinct_window_s: int, ratio_window_s: int,
               lateness_s: int = 60) -> FeatureSpec:
    """The example spec's features (count, sum, mean and max per window, then seconds since the previous
    event, distinct merchants and the amount's ratio to a window's mean) over other windows."""
    text = [_HEAD.format(lateness_s=lateness_s)]
    for w in windows_s:
        text += [_feature(f"count_{w}", "count", None, w), _feature(f"amount_sum_{w}", "sum", "amount", w),
                 _feature(f"amount_mean_{w}", "mean", "amount", w), _feature(f"amount_max_{w}", "max", "amount", w)]
    text += [_feature("secs_since_prev", "since_prev"),
             _feature(f"distinct_merchants_{distinct_window_s}", "distinct", "merchant_id", distinct_window_s),
             _feature(f"amount_to_mean_{ratio_window_s}", "ratio_to_mean", "amount", ratio_window_s)]
    return parse_spec("".join(text), source="fraud_like")

#!/usr/bin/env python3
"""Train an example model for a feature spec on its synthetic stream and write it as ONNX.

    python scripts/train_model.py                      # specs/fraud.toml -> models/fraud-mlp.onnx
    python scripts/train_model.py --spec specs/sensors.toml   # -> models/sensors-mlp.onnx
    python scripts/train_model.py --hidden 512,512,256 --name fraud-mlp-heavy --out models/x.onnx
    python scripts/train_model.py --bench-depth 2000 --name fraud-mlp-bench --out models/fraud-mlp-bench.onnx

Records come from the spec's synthetic stream (``app.synthetic.generator_for``) and go through the same
code the workers run: decoded and validated by the spec's contract (``agents.formats.codec``), routed by the
watermark with the spec's allowed lateness, their features computed by ``tables.features`` in arrival
order, so training and serving cannot drift apart. The model's ``feature_names`` are the spec's. The
network is a small MLP trained with numpy (Adam, weighted binary cross-entropy); the ONNX graph includes
the input transform (signed log1p, then standardisation), so workers feed raw feature values. Deterministic for a seed.

``--bench-depth N`` builds a *benchmark model* (``make bench`` uses ``models/fraud-mlp-bench.onnx``): the
same trained network plus a chain of ``N`` dense ReLU layers of width ``--bench-width`` that share one
weight matrix and enter the logit multiplied by zero. Its scores equal the plain network's, bit for bit,
and its cost has the shape of a deep model dominated by per-layer overhead: with ``N = 2000`` a one-row
call takes about 1 ms on a 2-core x86 machine, while a 256-row call costs only ~10-20× that, so batching
pays off as it does for larger models. It is not a better fraud model; it only makes inference cost real.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

from agents.formats.codec import Contract, Event, JsonInput
from app.synthetic import generator_for
from specs import EXAMPLE_SPEC
from tables.features import Watermark, apply_event, new_state
from tables.spec import FeatureSpec, load_spec

ROOT = Path(__file__).resolve().parent.parent


def build_dataset(spec: FeatureSpec, events: int, keys: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Generate the spec's stream and compute each on-time event's features with the serving code."""
    generator = generator_for(spec, keys=keys, seed=seed, start_ms=1_764_500_000_000, id_prefix="tx")
    decode = JsonInput(Contract(spec)).decode
    watermark = Watermark(spec.allowed_lateness_ms)
    states: dict[str, dict] = {}
    rows, labels = [], []
    for _ in range(events):
        record, positive = next(generator)
        event = decode(orjson.dumps(record))
        if not isinstance(event, Event):
            raise ValueError(f"the synthetic stream of {spec.name!r} wrote a record its spec refuses: {event}")
        if watermark.is_late(event.ts):
            continue
        watermark.observe(event.ts)
        state = states.setdefault(event.key, new_state(spec))
        applied = apply_event(state, event.id, event.ts, event.values, allowed_lateness_ms=spec.allowed_lateness_ms,
                              spec=spec)
        rows.append(applied.features)
        labels.append(1.0 if positive else 0.0)
    return np.asarray(rows, dtype=np.float64), np.asarray(labels, dtype=np.float64)


def signed_log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic)."""
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train(x: np.ndarray, y: np.ndarray, hidden: list[int], seed: int, epochs: int) -> list[tuple]:
    """Fit an MLP with ReLU layers and a sigmoid output; return [(W, b), ...]."""
    rng = np.random.default_rng(seed)
    sizes = [x.shape[1], *hidden, 1]
    params = [(rng.normal(0, np.sqrt(2 / a), (a, b)), np.zeros(b)) for a, b in zip(sizes, sizes[1:], strict=False)]
    moments = [[np.zeros_like(w), np.zeros_like(b), np.zeros_like(w), np.zeros_like(b)] for w, b in params]
    # Weight positives by the square root of the class ratio: recall without flooding alerts.
    pos_weight = np.sqrt((len(y) - y.sum()) / max(y.sum(), 1))
    lr, beta1, beta2, step = 2e-3, 0.9, 0.999, 0
    for _ in range(epochs):
        for batch in np.array_split(rng.permutation(len(x)), max(1, len(x) // 512)):
            xb, yb = x[batch], y[batch]
            acts = [xb]
            for i, (w, b) in enumerate(params):
                z = acts[-1] @ w + b
                acts.append(np.maximum(z, 0) if i < len(params) - 1 else 1 / (1 + np.exp(-z)))
            weights = np.where(yb == 1, pos_weight, 1.0)[:, None]
            grad = (acts[-1] - yb[:, None]) * weights / len(xb)
            step += 1
            for i in range(len(params) - 1, -1, -1):
                w, b = params[i]
                gw, gb = acts[i].T @ grad, grad.sum(0)
                if i:
                    grad = (grad @ w.T) * (acts[i] > 0)
                m = moments[i]
                for j, g in ((0, gw), (1, gb)):
                    m[j] = beta1 * m[j] + (1 - beta1) * g
                    m[j + 2] = beta2 * m[j + 2] + (1 - beta2) * g * g
                w -= lr * (m[0] / (1 - beta1**step)) / (np.sqrt(m[2] / (1 - beta2**step)) + 1e-8)
                b -= lr * (m[1] / (1 - beta1**step)) / (np.sqrt(m[3] / (1 - beta2**step)) + 1e-8)
    return params


def predict(x: np.ndarray, params: list[tuple]) -> np.ndarray:
    a = x
    for i, (w, b) in enumerate(params):
        z = a @ w + b
        a = np.maximum(z, 0) if i < len(params) - 1 else 1 / (1 + np.exp(-z))
    return a.reshape(-1)


def bench_block(n_in: int, depth: int, width: int, seed: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """``depth`` dense ReLU layers sharing one weight matrix, from ``h0`` to a zero-weighted term ``bench``."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    init = [
        numpy_helper.from_array((rng.normal(0, 1, (n_in, width)) / np.sqrt(n_in)).astype(f32), "BP"),
        numpy_helper.from_array((rng.normal(0, 1, (width, width)) / np.sqrt(width)).astype(f32), "BW"),
        numpy_helper.from_array(np.zeros(width, f32), "Bb"),
        numpy_helper.from_array(np.zeros(1, f32), "Bzero"),
        numpy_helper.from_array(np.array([1], np.int64), "Baxes"),
    ]
    nodes = [helper.make_node("MatMul", ["h0", "BP"], ["g0"])]
    for i in range(depth):
        nodes += [helper.make_node("MatMul", [f"g{i}", "BW"], [f"gm{i}"]),
                  helper.make_node("Add", [f"gm{i}", "Bb"], [f"ga{i}"]),
                  helper.make_node("Relu", [f"ga{i}"], [f"g{i + 1}"])]
    # ReLU layers with 1/sqrt(width) weights keep the values finite, so 0 * sum is exactly 0.
    nodes += [helper.make_node("ReduceSum", [f"g{depth}", "Baxes"], ["gsum"], keepdims=1),
              helper.make_node("Mul", ["gsum", "Bzero"], ["bench"])]
    return init, nodes


def to_onnx(params: list[tuple], mean: np.ndarray, std: np.ndarray, names: tuple[str, ...], name: str, version: str,
            metrics: dict, bench_depth: int = 0, bench_width: int = 32) -> onnx.ModelProto:
    """Build the graph: signed log1p, standardise, the MLP, sigmoid, one score per row."""
    f32 = np.float32
    init = [
        numpy_helper.from_array(np.array(1.0, f32), "one"),
        numpy_helper.from_array(mean.astype(f32), "mean"),
        numpy_helper.from_array(std.astype(f32), "std"),
        numpy_helper.from_array(np.array([-1], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("Abs", ["features"], ["abs"]),
        helper.make_node("Add", ["abs", "one"], ["abs1"]),
        helper.make_node("Log", ["abs1"], ["log"]),
        helper.make_node("Sign", ["features"], ["sign"]),
        helper.make_node("Mul", ["sign", "log"], ["slog"]),
        helper.make_node("Sub", ["slog", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["h0"]),
    ]
    for i, (w, b) in enumerate(params):
        init += [numpy_helper.from_array(w.astype(f32), f"W{i}"), numpy_helper.from_array(b.astype(f32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [f"h{i}", f"W{i}"], [f"z{i}"]),
                  helper.make_node("Add", [f"z{i}", f"b{i}"], [f"a{i}"])]
        last = i == len(params) - 1
        logit = f"a{i}"
        if last and bench_depth:
            block_init, block_nodes = bench_block(len(names), bench_depth, bench_width, seed=len(params))
            init += block_init
            nodes += [*block_nodes, helper.make_node("Add", [f"a{i}", "bench"], ["logit"])]
            logit = "logit"
        nodes.append(helper.make_node("Sigmoid" if last else "Relu", [logit], ["prob" if last else f"h{i + 1}"]))
    nodes.append(helper.make_node("Reshape", ["prob", "flat"], ["score"]))
    width = len(names)
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="seam")
    model.ir_version = 8
    helper.set_model_props(model, {
        "feature_names": json.dumps(list(names)),
        "model_name": name,
        "model_version": version,
        "training": json.dumps(metrics),
    })
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=EXAMPLE_SPEC, help="the feature spec (default: the example)")
    parser.add_argument("--out", type=Path, default=None, help="default: models/<spec name>-mlp.onnx")
    parser.add_argument("--name", default=None, help="default: <spec name>-mlp")
    parser.add_argument("--version", default="1")
    parser.add_argument("--hidden", default="32,16", help="hidden layer widths, comma separated")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", "--cards", type=int, default=2_000, help="distinct keys (cards, devices)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--bench-depth", type=int, default=0,
                        help="benchmark model: add this many zero-weighted shared-weight layers (see above)")
    parser.add_argument("--bench-width", type=int, default=32, help="width of the benchmark layers")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    name = args.name or f"{spec.name}-mlp"
    out = args.out or ROOT / "models" / f"{name}.onnx"

    x_raw, y = build_dataset(spec, args.events, args.keys, args.seed)
    x = signed_log(x_raw)
    mean, std = x.mean(0), x.std(0) + 1e-6
    x = (x - mean) / std
    split = int(len(x) * 0.8)
    hidden = [int(h) for h in args.hidden.split(",") if h]
    params = train(x[:split], y[:split], hidden, args.seed, args.epochs)
    scores = predict(x[split:], params)
    metrics = {
        "events": int(len(x)), "spec": spec.name, "positive_rate": round(float(y.mean()), 5),
        "holdout_auc": round(auc(scores, y[split:]), 4),
        "holdout_recall_at_0.5": round(float((scores[y[split:] == 1] >= 0.5).mean()), 4),
        "holdout_flag_rate_at_0.5": round(float((scores >= 0.5).mean()), 4),
        "seed": args.seed, "hidden": hidden,
    }
    if args.bench_depth:
        metrics["benchmark_block"] = {"depth": args.bench_depth, "width": args.bench_width}
    model = to_onnx(params, mean, std, spec.names, name, args.version, metrics, args.bench_depth, args.bench_width)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out)
    print(f"wrote {out} ({out.stat().st_size} bytes): {json.dumps(metrics)}")


if __name__ == "__main__":
    main()

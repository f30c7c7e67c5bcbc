"""A real ONNX model for tests that fails on marked rows: the committed model plus a Gather that
goes out of bounds (an ONNX Runtime error) for any row whose ``amount_max_60`` exceeds 1e6."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tables.features import DEFAULT_SPEC

ROOT = Path(__file__).resolve().parent.parent
POISON_AMOUNT = 9_999_999.0


def _committed_model_with_raw_score() -> tuple[onnx.ModelProto, onnx.ValueInfoProto]:
    """The committed model with its score renamed ``raw_score``, and its output, for a wrapper to write."""
    model = onnx.load(ROOT / "models" / "fraud-mlp.onnx")
    (output,) = model.graph.output
    for node in model.graph.node:
        node.output[:] = ["raw_score" if o == output.name else o for o in node.output]
    return model, output


def write_poison_model(path: Path) -> Path:
    """Write the wrapped model to ``path``."""
    model, output = _committed_model_with_raw_score()
    graph = model.graph
    column = DEFAULT_SPEC.names.index("amount_max_60")
    graph.initializer.extend([
        numpy_helper.from_array(np.array(column, dtype=np.int64), "poison_column"),
        numpy_helper.from_array(np.array(1e6, dtype=np.float32), "poison_limit"),
        numpy_helper.from_array(np.array(1000, dtype=np.int64), "poison_index"),
        numpy_helper.from_array(np.array([1.0], dtype=np.float32), "poison_ones"),
    ])
    graph.node.extend([
        helper.make_node("Gather", ["features", "poison_column"], ["poison_values"], axis=1),
        helper.make_node("Greater", ["poison_values", "poison_limit"], ["poison_flags"]),
        helper.make_node("Cast", ["poison_flags"], ["poison_ints"], to=onnx.TensorProto.INT64),
        helper.make_node("Mul", ["poison_ints", "poison_index"], ["poison_indices"]),
        helper.make_node("Gather", ["poison_ones", "poison_indices"], ["poison_gate"], axis=0),
        helper.make_node("Mul", ["raw_score", "poison_gate"], [output.name]),
    ])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def write_reordered_model(source: Path, path: Path, version: str = "9") -> Path:
    """Write ``source`` with its feature names in reverse order (and another version): the same network under a
    contract the feature spec does not meet, which a worker must refuse."""
    import json

    model = onnx.load(str(source))
    for prop in model.metadata_props:
        if prop.key == "feature_names":
            prop.value = json.dumps(list(reversed(json.loads(prop.value))))
        if prop.key == "model_version":
            prop.value = version
    onnx.save(model, str(path))
    return path


def write_slow_model(path: Path, matmuls: int = 40, size: int = 768) -> Path:
    """Write the committed model plus ``matmuls`` products of a ``size`` x ``size`` matrix made from the input (so
    ONNX Runtime cannot fold them away), added to the score times zero: the same scores, but every call (each
    warm-up call included) costs ``matmuls`` dense products, so the model takes seconds to load and warm."""
    model, output = _committed_model_with_raw_score()
    graph = model.graph
    graph.initializer.extend([
        numpy_helper.from_array(np.array([size, size], dtype=np.int64), "slow_shape"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "slow_zero"),
        numpy_helper.from_array(np.array(1.0 / size, dtype=np.float32), "slow_scale"),
    ])
    # J / size, where J is all ones: (J / size) @ (J / size) = J / size, so the chain stays finite.
    nodes = [
        helper.make_node("ReduceSum", ["features"], ["slow_sum"], keepdims=0),
        helper.make_node("Mul", ["slow_sum", "slow_zero"], ["slow_nothing"]),
        helper.make_node("Add", ["slow_nothing", "slow_scale"], ["slow_cell"]),
        helper.make_node("Expand", ["slow_cell", "slow_shape"], ["slow_0"]),
    ]
    for i in range(matmuls):
        nodes.append(helper.make_node("MatMul", [f"slow_{i}", f"slow_{i}"], [f"slow_{i + 1}"]))
    nodes += [
        helper.make_node("ReduceMean", [f"slow_{matmuls}"], ["slow_mean"], keepdims=0),
        helper.make_node("Mul", ["slow_mean", "slow_zero"], ["slow_offset"]),
        helper.make_node("Add", ["raw_score", "slow_offset"], [output.name]),
    ]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path

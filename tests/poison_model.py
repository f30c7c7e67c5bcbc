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


def write_poison_model(path: Path) -> Path:
    """Write the wrapped model to ``path``."""
    model = onnx.load(ROOT / "models" / "fraud-mlp.onnx")
    graph = model.graph
    (output,) = graph.output
    for node in graph.node:
        node.output[:] = ["raw_score" if o == output.name else o for o in node.output]
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

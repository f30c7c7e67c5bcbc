"""The example feature specs seam ships as package data: what ``SEAM_FEATURE_SPEC`` reads when it is not set."""

from pathlib import Path

__all__ = ["EXAMPLE_SPEC", "SPECS"]

SPECS = Path(__file__).resolve().parent
# Card transactions and fifteen fraud features: the example model (models/fraud-mlp.onnx) is trained on them.
EXAMPLE_SPEC = SPECS / "fraud.toml"

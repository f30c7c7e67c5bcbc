"""The example model seam ships as package data: what ``SEAM_MODEL_PATH`` serves when it is not set."""

from pathlib import Path

__all__ = ["EXAMPLE_MODEL"]

# scripts/train_model.py (make model) writes it; the wheel carries it, so an installed worker finds it too.
EXAMPLE_MODEL = Path(__file__).resolve().with_name("fraud-mlp.onnx")

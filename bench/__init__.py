"""seam's end-to-end benchmark (``make bench``, ``seam bench``): seam against its baselines and ceilings."""

__all__ = ["harness", "job", "kafka", "report"]

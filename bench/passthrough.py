"""Ceiling A as its own process: ``python -m bench.passthrough BOOTSTRAP SOURCE SINK EXPECTED``."""

from __future__ import annotations

import asyncio
import sys

from bench.kafka import raw_passthrough

if __name__ == "__main__":
    bootstrap, source, sink, expected = sys.argv[1:5]
    asyncio.run(raw_passthrough(bootstrap, source, sink, int(expected)))

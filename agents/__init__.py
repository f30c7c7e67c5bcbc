"""The stream pipeline: decoding, the scoring agent, the model boundary and the model runtime."""

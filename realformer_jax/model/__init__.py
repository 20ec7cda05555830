"""The encoder's building blocks: embeddings, residual attention, the layer and its stack, heads,
and the parameter helpers (boxing, stacking scanned layers)."""

"""Single-turn verifiable-reward environments (one prompt, one scored answer span)."""

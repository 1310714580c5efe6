"""The depth ladder: compact tasks whose difficulty is the number of serial steps (see base.py)."""

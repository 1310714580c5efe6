"""The loop-curriculum dashboard: `elr-rl dashboard RUN_DIR [--port N] [--export FILE.html]`.

The run-directory format it reads is documented in `elr_rl/metrics.py` and README.md here.
"""

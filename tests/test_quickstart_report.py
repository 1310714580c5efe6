"""The quickstart's closing report: one line per (environment, difficulty), before -> after per k."""

from __future__ import annotations

import json

from elr_rl.quickstart import parse, print_report


def _rows(pass_at_1: dict[tuple[str, int, int], float]) -> list[dict]:
    return [{"env": e, "difficulty": d, "k": k, "tasks": 32, "pass_at_1": p, "pass_at_1_sampled": p / 2,
             "reward": p, "response_tokens": 20.0 + k} for (e, d, k), p in pass_at_1.items()]


def test_report_has_a_line_per_environment_and_difficulty(tmp_path, capsys):
    keys = [(e, d, k) for e in ("even_odd", "arith_multidigit") for d in (1, 2) for k in (1, 4)]
    before = {key: 0.25 for key in keys}
    after = {key: 0.5 if key[1] == 2 else 0.75 for key in keys}
    (tmp_path / "eval_before.json").write_text(json.dumps(_rows(before)))
    (tmp_path / "eval_after.json").write_text(json.dumps(_rows(after)))
    print_report(tmp_path, 120.0, seed=3)
    out = capsys.readouterr().out
    assert "seed 3, 2.0 min" in out
    lines = [ln for ln in out.splitlines() if ln.startswith(("even_odd", "arith_multidigit"))]
    assert len(lines) == 8  # 2 environments x 2 difficulties, greedy and sampled
    greedy_d2 = next(ln for ln in lines if ln.startswith("even_odd (D=2)"))
    assert greedy_d2.split()[2:] == ["0.25", "->", "0.50", "0.25", "->", "0.50"]
    sampled_d1 = [ln for ln in lines if ln.startswith("even_odd (D=1)")][1]
    assert sampled_d1.split()[2:5] == ["0.12", "->", "0.38"]


def test_arguments_default_to_runs_quickstart_and_seed_zero():
    args = parse([])
    assert (args.run, args.seed) == ("runs/quickstart", 0)
    args = parse(["/tmp/x", "--seed", "1"])
    assert (args.run, args.seed) == ("/tmp/x", 1)

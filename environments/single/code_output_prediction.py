"""Predict what a generated Python snippet prints (program tracing).

Programs are built as small trees (assignments, `for` loops, `if`, list
appends, prints) that we both render to Python and run with our own tiny
interpreter, which also writes the trace for the worked solution. D sets the
statement count, the loop length and which constructs appear. The answer is
the printed text, compared after stripping trailing spaces and blank edges.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

PREC = {"+": 1, "-": 1, "*": 2, "%": 2, "//": 2}
MAX_VALUE = 100_000


def render_expr(e: list, parent: int = 0, right: bool = False) -> str:
    if e[0] == "num":
        return str(e[1])
    if e[0] == "var":
        return e[1]
    if e[0] == "len":
        return f"len({e[1]})"
    _, op, a, b = e
    p = PREC[op]
    text = f"{render_expr(a, p)} {op} {render_expr(b, p, True)}"
    return f"({text})" if p < parent or (right and p == parent) else text


def eval_expr(e: list, env: dict) -> int:
    if e[0] == "num":
        return e[1]
    if e[0] == "var":
        return env[e[1]]
    if e[0] == "len":
        return len(env[e[1]])
    _, op, a, b = e
    x, y = eval_expr(a, env), eval_expr(b, env)
    return {"+": x + y, "-": x - y, "*": x * y, "%": x % y if y else 0, "//": x // y if y else 0}[op]


def render(stmts: list, indent: str = "") -> list[str]:
    out = []
    for s in stmts:
        kind = s[0]
        if kind == "assign":
            out.append(f"{indent}{s[1]} = {render_expr(s[2])}")
        elif kind == "newlist":
            out.append(f"{indent}{s[1]} = []")
        elif kind == "append":
            out.append(f"{indent}{s[1]}.append({render_expr(s[2])})")
        elif kind == "print":
            out.append(f"{indent}print({', '.join(render_expr(e) for e in s[1])})")
        elif kind == "for":
            out.append(f"{indent}for {s[1]} in range({s[2]}):")
            out += render(s[3], indent + "    ")
        elif kind == "if":
            out.append(f"{indent}if {render_expr(s[1])} {s[2]} {render_expr(s[3])}:")
            out += render(s[4], indent + "    ")
            out.append(f"{indent}else:")
            out += render(s[5], indent + "    ")
    return out


def run(stmts: list, env: dict, output: list[str], trace: list[str], prefix: str = "") -> None:
    """Execute our own statement trees (never model text); `trace` gets one line per state change."""
    for s in stmts:
        kind = s[0]
        if kind == "assign":
            env[s[1]] = eval_expr(s[2], env)
            trace.append(f"{prefix}{s[1]} = {env[s[1]]}")
            if abs(env[s[1]]) > MAX_VALUE:
                raise OverflowError
        elif kind == "newlist":
            env[s[1]] = []
        elif kind == "append":
            env[s[1]].append(eval_expr(s[2], env))
            trace.append(f"{prefix}{s[1]} = {env[s[1]]}")
        elif kind == "print":
            line = " ".join(str(eval_expr(e, env)) if e[0] != "var" else str(env[e[1]]) for e in s[1])
            output.append(line)
            trace.append(f"{prefix}print -> {line}")
        elif kind == "for":
            for i in range(s[2]):
                env[s[1]] = i
                run(s[3], env, output, trace, f"{prefix}{s[1]}={i}: ")
        elif kind == "if":
            x, y = eval_expr(s[1], env), eval_expr(s[3], env)
            took = {"<": x < y, ">": x > y, "==": x == y}[s[2]]
            trace.append(f"{prefix}{x} {s[2]} {y} is {took}")
            run(s[4] if took else s[5], env, output, trace, prefix)


class _Gen:
    """Random statement trees for one difficulty level."""

    def __init__(self, rng: random.Random, d: int) -> None:
        self.rng, self.d = rng, d
        self.names = rng.sample("abcmnpxyz", 1 + min(2, d // 3))
        self.loop_len = 2 + d // 3
        self.use_list = d >= 3 and rng.random() < 0.5

    def operand(self, loop_vars: list[str]) -> list:
        pool = [["num", self.rng.randint(1, 9)]] + [["var", v] for v in self.names + loop_vars]
        return self.rng.choice(pool)

    def assign(self, loop_vars: list[str]) -> list:
        rng, v = self.rng, self.rng.choice(self.names)
        op = rng.choice(["+", "+", "-", "*"] if self.d >= 2 else ["+", "-"])
        other = ["num", rng.randint(2, 3)] if op == "*" else self.operand(loop_vars)
        expr = ["bin", op, ["var", v], other]
        if self.d >= 5 and rng.random() < 0.4:
            expr = ["bin", rng.choice(["%", "//"]), expr, ["num", rng.randint(2, 9)]]
        return ["assign", v, expr]

    def body_stmt(self, loop_vars: list[str], depth: int) -> list:
        rng = self.rng
        r = rng.random()
        if self.use_list and r < 0.25:
            return ["append", "xs", self.operand(loop_vars)]
        if self.d >= 4 and r < 0.45:
            v = rng.choice(self.names)
            cond = (
                (["bin", "%", ["var", v], ["num", 2]], "==", ["num", 0])
                if rng.random() < 0.5
                else (["var", v], rng.choice("<>"), ["num", rng.randint(2, 20)])
            )
            return ["if", cond[0], cond[1], cond[2], [self.assign(loop_vars)], [self.assign(loop_vars)]]
        if self.d >= 8 and depth == 1 and r < 0.6:
            return ["for", "j", 2, [self.assign(loop_vars + ["j"])]]
        if self.d >= 6 and r < 0.55:
            return ["print", [["var", rng.choice(self.names)]]]
        return self.assign(loop_vars)

    def program(self) -> list:
        stmts: list = [["assign", v, ["num", self.rng.randint(0, 9)]] for v in self.names]
        if self.use_list:
            stmts.append(["newlist", "xs"])
        n_body = 1 + (self.d >= 5)
        while len(stmts) < 1 + self.d:
            if self.d >= 2 and not any(s[0] == "for" for s in stmts) and self.rng.random() < 0.6:
                stmts.append(["for", "i", self.loop_len, [self.body_stmt(["i"], 1) for _ in range(n_body)]])
            else:
                stmts.append(self.body_stmt([], 0))
        final = [["var", v] for v in self.names] + ([["var", "xs"]] if self.use_list else [])
        return stmts + [["print", final]]


def normalise(text: str) -> str:
    """Output compared modulo trailing spaces per line and blank lines at the edges."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip()


class CodeOutputPrediction(SingleTurnEnv):
    name = "code_output_prediction"
    domain = "code"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        for _ in range(200):
            gen = _Gen(rng, difficulty)
            prog = gen.program()
            output: list[str] = []
            trace: list[str] = []
            try:
                run(prog, {}, output, trace)
            except OverflowError:
                continue
            break
        code = "\n".join(render(prog))
        prompt = (
            f"What does this Python program print?\n```python\n{code}\n```\n"
            f"Answer with the exact printed output.\n{ANSWER_INSTRUCTION}"
        )
        stats = {"statements": 1 + difficulty, "loop_length": gen.loop_len}
        hidden = {"code": code, "trace": trace}
        return Task(self.name, seed, difficulty, prompt, "\n".join(output), hidden, stats)

    def check(self, task: Task, span: str) -> bool:
        return normalise(span) == normalise(task.answer)

    def answer_text(self, task: Task) -> str:
        return task.answer

    def wrong_texts(self, task: Task) -> list[str]:
        lines = task.answer.split("\n")
        last = lines[-1].split(" ")
        first = last[0]
        bumped = str(int(first) + 1) if first.lstrip("-").isdigit() else first + "0"
        wrong = ["\n".join(lines[:-1] + [" ".join([bumped] + last[1:])])]
        if len(lines) > 1:
            wrong.append("\n".join(lines[:-1]))
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["trace"]

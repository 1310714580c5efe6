"""Nested arithmetic expressions evaluated exactly: rational trees, `mod p`, and `a^b mod m`.

D is the number of operations. The answer comes from an exact evaluator over
the generated tree (`Fraction`); the worked solution reduces the innermost
operation one line at a time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, fmt_num
from environments.verifiers import math_equal

KINDS = ("frac", "mod", "powmod")


@dataclass
class Node:
    """A leaf (op is None, value set) or a binary operation."""

    op: str | None = None
    left: Node | None = None
    right: Node | None = None
    value: Fraction = Fraction(0)


def _leaf_text(v: Fraction) -> str:
    s = fmt_num(v)
    return f"({s})" if v < 0 or v.denominator != 1 else s


def render(node: Node, top: bool = True) -> str:
    if node.op is None:
        return fmt_num(node.value) if top else _leaf_text(node.value)
    text = f"{render(node.left, False)} {node.op} {render(node.right, False)}"
    return text if top else f"({text})"


def evaluate(node: Node) -> Fraction:
    if node.op is None:
        return node.value
    a, b = evaluate(node.left), evaluate(node.right)
    if node.op == "+":
        return a + b
    if node.op == "-":
        return a - b
    if node.op == "*":
        return a * b
    if b == 0:
        raise ZeroDivisionError
    return a / b


def random_tree(rng: random.Random, n_ops: int, ops: str, max_leaf: int) -> Node:
    if n_ops == 0:
        return Node(value=Fraction(rng.randint(1, max_leaf)))
    k = rng.randint(0, n_ops - 1)
    return Node(rng.choice(ops), random_tree(rng, k, ops, max_leaf), random_tree(rng, n_ops - 1 - k, ops, max_leaf))


def reduce_once(node: Node) -> bool:
    """Replace the leftmost operation whose operands are both numbers by its value."""
    if node.op is None:
        return False
    if node.left.op is None and node.right.op is None:
        node.value, node.op, node.left, node.right = evaluate(node), None, None, None
        return True
    return reduce_once(node.left) or reduce_once(node.right)


class ExprEval(SingleTurnEnv):
    name = "expr_eval"
    domain = "math"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        d = difficulty
        hidden: dict = {"kind": kind}
        if kind == "powmod":
            m = rng.choice([7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47][: 3 + d])
            a, b = rng.randint(2, m - 1), d + 1
            answer = pow(a, b, m)
            hidden.update(a=a, b=b, m=m)
            prompt = f"Compute {a}^{b} mod {m}. Answer with an integer from 0 to {m - 1}."
        else:
            for _ in range(100):
                tree = random_tree(rng, d, "+-*/" if kind == "frac" else "+-*", 3 + d)
                try:
                    value = evaluate(tree)
                except ZeroDivisionError:
                    continue
                break
            hidden["expr"] = render(tree)
            if kind == "frac":
                answer = fmt_num(value)
                how = "Answer with an integer or a reduced fraction such as -7/3."
                prompt = f"Compute {hidden['expr']} exactly. {how}"
            else:
                p = rng.choice([5, 7, 11, 13, 17, 19])
                answer, hidden["p"], hidden["value"] = int(value) % p, p, int(value)
                prompt = f"Compute ({hidden['expr']}) mod {p}. Answer with an integer from 0 to {p - 1}."
        return Task(self.name, seed, difficulty, f"{prompt}\n{ANSWER_INSTRUCTION}", answer, hidden, {"operations": d})

    def check(self, task: Task, span: str) -> bool:
        return math_equal(span, fmt_num(Fraction(task.answer)))  # the shared math checker (3/4 = 0.75)

    def answer_text(self, task: Task) -> str:
        return fmt_num(Fraction(task.answer))

    def wrong_texts(self, task: Task) -> list[str]:
        a = Fraction(task.answer)
        wrong = [fmt_num(a + 1), fmt_num(-a - 2)]
        if task.hidden["kind"] == "frac" and a != 0:
            wrong.append(fmt_num(1 / a) if abs(a) != 1 else fmt_num(a * 3))
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        h = task.hidden
        if h["kind"] == "powmod":
            lines, acc = [], h["a"] % h["m"]
            for k in range(2, h["b"] + 1):
                new = acc * h["a"] % h["m"]
                lines.append(f"{h['a']}^{k} = {acc} * {h['a']} = {acc * h['a']} = {new} mod {h['m']}")
                acc = new
            return lines
        tree = _parse_rendered(h["expr"])
        lines = []
        while reduce_once(tree):
            lines.append(f"= {render(tree)}")
        if h["kind"] == "mod":
            v = int(h["value"])
            lines.append(f"{v} mod {h['p']} = {v % h['p']}")
        return lines


def _parse_rendered(text: str) -> Node:
    """Rebuild a tree from its own rendering (fully parenthesised, our output only)."""
    toks = text.replace("(", " ( ").replace(")", " ) ").split()
    pos = 0

    def operand() -> Node:
        nonlocal pos
        if toks[pos] == "(":
            pos += 1
            node = expr()
            pos += 1  # ')'
            return node
        tok = toks[pos]
        pos += 1
        return Node(value=Fraction(tok))

    def expr() -> Node:
        nonlocal pos
        left = operand()
        if pos < len(toks) and toks[pos] in "+-*/" and toks[pos] != ")":
            op = toks[pos]
            pos += 1
            return Node(op, left, operand())
        return left

    return expr()

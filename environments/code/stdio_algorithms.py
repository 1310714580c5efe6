"""code_stdio_algorithms: competitive-programming problems read on stdin, answered on stdout.

D sets the input size n (10 * 2^(D-1) elements, so quadratic solutions run out
of CPU time at high D), the number of hidden tests and which templates can be
drawn. Expected outputs are computed in the parent by trusted solvers; every
hidden test must match (whitespace-normalised) within the sandbox's CPU limit.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, ClassVar

from environments.base import Environment, Score, Task
from environments.code.harness import extract_code, fence, run_harness


@dataclass(frozen=True)
class Template:
    """A problem family: statement, input generator, trusted solver, reference program."""

    statement: str
    make_input: Callable[[random.Random, int], str]
    solve: Callable[[str], str]
    program: str


def _ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _in_k_largest(rng, n):
    return f"{n} {rng.randint(1, n)}\n{' '.join(map(str, _ints(rng, n, -1000, 1000)))}\n"


def _solve_k_largest(s):
    t = s.split()
    n, k = int(t[0]), int(t[1])
    return str(sum(sorted(map(int, t[2 : 2 + n]), reverse=True)[:k]))


def _in_pairs(rng, n):
    xs = _ints(rng, n, 0, max(10, n // 2))
    return f"{n} {rng.randint(0, max(10, n // 2) * 2)}\n{' '.join(map(str, xs))}\n"


def _solve_pairs(s):
    t = list(map(int, s.split()))
    target, xs = t[1], t[2 : 2 + t[0]]
    seen, count = Counter(), 0
    for x in xs:
        count += seen[target - x]
        seen[x] += 1
    return str(count)


def _in_ranges(rng, n):
    xs, q = _ints(rng, n, -100, 100), max(1, n // 2)
    qs = [sorted((rng.randint(1, n), rng.randint(1, n))) for _ in range(q)]
    return f"{n} {q}\n{' '.join(map(str, xs))}\n" + "".join(f"{a} {b}\n" for a, b in qs)


def _solve_ranges(s):
    t = list(map(int, s.split()))
    n, q = t[0], t[1]
    pre = [0]
    for x in t[2 : 2 + n]:
        pre.append(pre[-1] + x)
    qs = t[2 + n :]
    return "\n".join(str(pre[qs[2 * i + 1]] - pre[qs[2 * i] - 1]) for i in range(q))


def _in_run(rng, n):
    return f"{n}\n{' '.join(map(str, _ints(rng, n, 0, 20)))}\n"


def _solve_run(s):
    xs = list(map(int, s.split()))[1:]
    best = cur = 1 if xs else 0
    for a, b in zip(xs, xs[1:]):
        cur = cur + 1 if b > a else 1
        best = max(best, cur)
    return str(best)


def _in_brackets(rng, n):
    lines = []
    for _ in range(max(1, n // 20)):
        s = _balanced(rng, rng.randint(1, 20))
        if rng.random() < 0.5 and s:
            i = rng.randrange(len(s))
            s = s[:i] + rng.choice("()[]{}") + s[i + 1 :]
        lines.append(s)
    return f"{len(lines)}\n" + "".join(line + "\n" for line in lines)


def _balanced(rng, pairs):
    out, stack = [], []
    while pairs or stack:
        if pairs and (not stack or rng.random() < 0.5):
            o, c = rng.choice(["()", "[]", "{}"])
            out.append(o)
            stack.append(c)
            pairs -= 1
        else:
            out.append(stack.pop())
    return "".join(out)


def _solve_brackets(s):
    lines = s.split("\n")
    res = []
    for line in lines[1 : 1 + int(lines[0])]:
        stack, ok = [], True
        for ch in line.strip():
            if ch in "([{":
                stack.append(ch)
            elif not stack or "([{"[")]}".index(ch)] != stack.pop():
                ok = False
                break
        res.append("YES" if ok and not stack else "NO")
    return "\n".join(res)


def _in_coins(rng, n):
    coins = sorted(set(_ints(rng, rng.randint(2, 5), 2, 30)))
    return f"{len(coins)} {min(n * 3, 30000)}\n{' '.join(map(str, coins))}\n"


def _solve_coins(s):
    t = list(map(int, s.split()))
    amount, coins = t[1], t[2 : 2 + t[0]]
    inf = amount + 1
    best = [0] + [inf] * amount
    for a in range(1, amount + 1):
        best[a] = min([best[a - c] + 1 for c in coins if c <= a] + [inf])
    return str(best[amount] if best[amount] < inf else -1)


def _in_components(rng, n):
    m = rng.randint(n // 2, n)
    edges = [(rng.randint(1, n), rng.randint(1, n)) for _ in range(m)]
    return f"{n} {m}\n" + "".join(f"{a} {b}\n" for a, b in edges)


def _solve_components(s):
    t = list(map(int, s.split()))
    n, m = t[0], t[1]
    parent = list(range(n + 1))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(m):
        parent[find(t[2 + 2 * i])] = find(t[3 + 2 * i])
    return str(len({find(v) for v in range(1, n + 1)}))


_P = "import sys\ndata = sys.stdin.read().split()\n"
TEMPLATES = [
    Template("The first line holds n and k; the second n integers. Print the sum of the k largest integers.",
             _in_k_largest, _solve_k_largest,
             _P + "n, k = int(data[0]), int(data[1])\nxs = sorted(map(int, data[2:2 + n]), reverse=True)\nprint(sum(xs[:k]))"),
    Template("The first line holds n; the second n integers. Print the length of the longest contiguous strictly "
             "increasing run.", _in_run, _solve_run,
             _P + "xs = list(map(int, data[1:]))\nbest = cur = 1 if xs else 0\nfor a, b in zip(xs, xs[1:]):\n"
             "    cur = cur + 1 if b > a else 1\n    best = max(best, cur)\nprint(best)"),
    Template("The first line holds n and q; the second n integers a_1..a_n; then q lines `l r` (1 <= l <= r <= n). "
             "For each query print a_l + ... + a_r on its own line.", _in_ranges, _solve_ranges,
             _P + "n, q = int(data[0]), int(data[1])\npre = [0]\nfor x in data[2:2 + n]:\n    pre.append(pre[-1] + int(x))\n"
             "out = []\nfor i in range(q):\n    l, r = int(data[2 + n + 2 * i]), int(data[3 + n + 2 * i])\n"
             "    out.append(str(pre[r] - pre[l - 1]))\nprint('\\n'.join(out))"),
    Template("The first line holds t; then t lines of brackets ()[]{}. For each line print YES if it is balanced, "
             "else NO.", _in_brackets, _solve_brackets,
             "import sys\nlines = sys.stdin.read().split('\\n')\nout = []\nfor line in lines[1:1 + int(lines[0])]:\n"
             "    stack, ok = [], True\n    for ch in line.strip():\n        if ch in '([{':\n            stack.append(ch)\n"
             "        elif not stack or '([{'[')]}'.index(ch)] != stack.pop():\n            ok = False\n            break\n"
             "    out.append('YES' if ok and not stack else 'NO')\nprint('\\n'.join(out))"),
    Template("The first line holds n and a target T; the second n integers. Print the number of pairs i < j with "
             "a_i + a_j = T.", _in_pairs, _solve_pairs,
             _P + "from collections import Counter\nn, t = int(data[0]), int(data[1])\nseen, count = Counter(), 0\n"
             "for x in map(int, data[2:2 + n]):\n    count += seen[t - x]\n    seen[x] += 1\nprint(count)"),
    Template("The first line holds k and an amount A; the second k coin values (unlimited supply of each). Print the "
             "fewest coins summing exactly to A, or -1 if impossible.", _in_coins, _solve_coins,
             _P + "k, a = int(data[0]), int(data[1])\ncoins = list(map(int, data[2:2 + k]))\ninf = a + 1\n"
             "best = [0] + [inf] * a\nfor v in range(1, a + 1):\n    best[v] = min([best[v - c] + 1 for c in coins if c <= v] + [inf])\n"
             "print(best[a] if best[a] < inf else -1)"),
    Template("The first line holds n and m; then m lines `u v`, undirected edges between nodes 1..n. Print the "
             "number of connected components.", _in_components, _solve_components,
             _P + "n, m = int(data[0]), int(data[1])\nparent = list(range(n + 1))\ndef find(x):\n    while parent[x] != x:\n"
             "        parent[x] = parent[parent[x]]\n        x = parent[x]\n    return x\nfor i in range(m):\n"
             "    parent[find(int(data[2 + 2 * i]))] = find(int(data[3 + 2 * i]))\nprint(len({find(v) for v in range(1, n + 1)}))"),
]  # fmt: skip


def normalise_output(text: str) -> str:
    """Trailing spaces per line and trailing blank lines do not matter; everything else does."""
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")).strip()


class CodeStdioAlgorithms(Environment):
    name: ClassVar[str] = "code_stdio_algorithms"
    sandboxed = True  # runs model-written code
    domain: ClassVar[str] = "code"
    max_concurrency: ClassVar[int] = 4
    score_timeout_s: ClassVar[float] = 30.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        # Harder levels unlock the later templates (DP, union-find) and grow n.
        t_index = rng.randrange(min(len(TEMPLATES), 2 + (difficulty + 1) // 2))
        tpl = TEMPLATES[t_index]
        n, n_tests = 10 * 2 ** (difficulty - 1), 3 + (difficulty + 1) // 2
        example = tpl.make_input(rng, min(n, 8))
        inputs = [tpl.make_input(rng, rng.randint(max(1, n // 2), n)) for _ in range(n_tests)]
        expected = [tpl.solve(s) for s in inputs]
        prompt = (
            f"{tpl.statement}\n\nLimits: n up to {n}; your program gets a few seconds of CPU time per run.\n\n"
            f"Example input:\n{example}\nExample output:\n{tpl.solve(example)}\n\n"
            "Write a complete Python 3 program that reads stdin and writes stdout (standard library only). "
            "Put the program between <answer> and </answer> (a ```python fence inside is fine)."
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=tpl.program,
            hidden={"inputs": inputs, "expected": expected, "example_output": tpl.solve(example)},
            stats={"n": float(n), "tests": float(n_tests), "template": float(t_index)},
        )  # fmt: skip

    def score(self, task: Task, completion: str) -> Score:
        code = extract_code(completion)
        if code is None:
            return Score.binary(False, pass_rate=0.0)
        run = run_harness(code, "stdio", task.hidden["inputs"])
        if run.results is None:
            return Score.binary(False, pass_rate=0.0)
        passed = sum(
            "error" not in r and normalise_output(str(r.get("stdout", ""))) == normalise_output(e)
            for r, e in zip(run.results, task.hidden["expected"])
        )
        return Score.binary(passed == len(run.results), pass_rate=passed / len(run.results))

    def reference_solution(self, task: Task) -> str:
        return fence(task.answer)

    def bad_answers(self, task: Task) -> list[str]:
        expected = [normalise_output(e) for e in task.hidden["expected"]]
        bad = []
        # Hard-coding the example's answer passes the visible example only.
        for const in (task.hidden["example_output"], "0", "-1"):
            if any(normalise_output(const) != e for e in expected):
                bad.append(f"print({const!r})")
        bad.append("import sys\nprint('PASSED')\nsys.exit(0)")
        return [fence(b) for b in bad]

    def worked_response(self, task: Task) -> str:
        return (
            "Read the whole input at once and split it into tokens, compute the answer in one pass "
            "(or with a table for the counting problems) so large inputs stay fast, then print it.\n"
            + fence(task.answer)
        )

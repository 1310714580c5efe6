"""Logic puzzles checked clause by clause: knights and knaves, small SAT, zebra puzzles.

Any assignment that satisfies every statement (knights tell the truth, knaves
lie), every clause or every zebra clue is accepted, so the checker never
depends on a unique solution. D sets the number of people and statements,
variables and clauses, or houses, categories and clues.
"""

from __future__ import annotations

import itertools
import random
import re

from environments.base import Task
from environments.single import zebra
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

KINDS = ("knights", "sat", "zebra")
PEOPLE = ["Ava", "Ben", "Cai", "Dee", "Eko", "Fay", "Gil"]
_PAIR_RE = re.compile(r"\s*([A-Za-z]\w*)\s*[=:]\s*([A-Za-z0-9]+)\s*")


def stmt_true(st: list, world: dict[str, bool]) -> bool:
    """Truth of a statement [form, names...] in a world (name -> is knight)."""
    form, *xs = st
    v = [world[x] for x in xs]
    return {
        "knight": lambda: v[0],
        "knave": lambda: not v[0],
        "both_knights": lambda: v[0] and v[1],
        "both_knaves": lambda: not v[0] and not v[1],
        "some_knight": lambda: v[0] or v[1],
        "same": lambda: v[0] == v[1],
        "different": lambda: v[0] != v[1],
        "one_knave_of3": lambda: sum(not x for x in v) == 1,
    }[form]()


def say(st: list) -> str:
    form, *xs = st
    return {
        "knight": "{0} is a knight",
        "knave": "{0} is a knave",
        "both_knights": "{0} and {1} are both knights",
        "both_knaves": "{0} and {1} are both knaves",
        "some_knight": "at least one of {0} and {1} is a knight",
        "same": "{0} and {1} are the same kind",
        "different": "{0} and {1} are different kinds",
        "one_knave_of3": "exactly one of {0}, {1} and {2} is a knave",
    }[form].format(*xs)


def parse_assignment(span: str, names: list[str], true_words: set[str], false_words: set[str]) -> dict[str, bool]:
    """{name: bool} from "A=x, B=y"; every name exactly once; raises ValueError otherwise."""
    out: dict[str, bool] = {}
    for part in span.split(","):
        m = _PAIR_RE.fullmatch(part)
        if not m:
            raise ValueError("bad pair")
        key, val = m.group(1).lower(), m.group(2).lower()
        name = next((n for n in names if n.lower() == key), None)
        if name is None or name in out or val not in true_words | false_words:
            raise ValueError("bad name or value")
        out[name] = val in true_words
    if set(out) != set(names):
        raise ValueError("names missing")
    return out


def _knights(rng: random.Random, d: int) -> tuple[str, dict, dict, dict]:
    p, n_st = 2 + (d - 1) // 2, d + 1
    names = PEOPLE[:p]
    world = {x: rng.random() < 0.5 for x in names}
    statements = []
    for i in range(n_st):
        speaker = names[i] if i < p else rng.choice(names)
        while True:
            form = rng.choice(
                ["knight", "knave", "both_knights", "both_knaves", "some_knight", "same", "different"]
                + (["one_knave_of3"] if p >= 3 else [])
            )
            k = 1 if form in ("knight", "knave") else 3 if form == "one_knave_of3" else 2
            pool = [x for x in names if x != speaker] if k == 1 else names
            st = [form, *rng.sample(pool, k)]
            if stmt_true(st, world) == world[speaker] and [speaker, st] not in statements:
                break
        statements.append([speaker, st])
    text = "\n".join(f'{s} says: "{say(st)}."' for s, st in statements)
    prompt = (
        f"On an island, knights always tell the truth and knaves always lie. {', '.join(names)} each are a knight or "
        f"a knave.\n{text}\nWho is a knight and who is a knave? Answer like {names[0]}=knight, {names[1]}=knave."
    )
    if p <= 3:  # small: show the search itself, and answer with the first assignment that fits
        world, lines = _knights_search(names, statements)
    else:
        lines = [
            f'{s} is a {"knight" if world[s] else "knave"}; "{say(st)}" is {stmt_true(st, world)}: consistent'
            for s, st in statements
        ]
    return (
        prompt,
        world,
        {"names": names, "statements": statements, "lines": lines},
        {"entities": p, "constraints": n_st},
    )


def _knights_search(names: list[str], statements: list) -> tuple[dict[str, bool], list[str]]:
    """Try assignments in order (knights first); each rejected one names the statement it breaks."""
    lines = []
    for bits in itertools.product([True, False], repeat=len(names)):
        world = dict(zip(names, bits))
        guess = ", ".join(f"{x}={'knight' if v else 'knave'}" for x, v in world.items())
        broken = next(((s, st) for s, st in statements if stmt_true(st, world) != world[s]), None)
        if broken is None:
            lines.append(f"{guess}: every statement fits")
            return world, lines
        s, st = broken
        kind = "knight" if world[s] else "knave"
        lines.append(f'{guess}: no, {s} would be a {kind} but "{say(st)}" would be {stmt_true(st, world)}')
    raise AssertionError("the planted assignment always fits")


def _sat(rng: random.Random, d: int) -> tuple[str, dict, dict, dict]:
    n = 2 + d
    k = 2 if d <= 2 else 3
    m = 2 * n if k == 2 else 4 * n
    world = {f"x{i + 1}": rng.random() < 0.5 for i in range(n)}
    clauses: list[list[int]] = []
    while len(clauses) < m:
        vs = rng.sample(range(1, n + 1), k)
        cl = sorted((v if rng.random() < 0.5 else -v for v in vs), key=abs)
        if cl not in clauses and any(world[f"x{abs(l)}"] == (l > 0) for l in cl):  # planted solution satisfies all
            clauses.append(cl)
    text = "\n".join(
        f"{i + 1}: " + " or ".join(("not " if l < 0 else "") + f"x{abs(l)}" for l in cl) for i, cl in enumerate(clauses)
    )
    prompt = (
        f"Find values (1 = true, 0 = false) for x1..x{n} that make every clause true.\n{text}\n"
        f"Answer like x1=1, x2=0, ... listing all {n} variables."
    )
    hidden = {"names": list(world), "clauses": clauses, "lines": _dpll_trace(clauses, world)}
    return prompt, world, hidden, {"entities": n, "constraints": m}


def _dpll_trace(clauses: list[list[int]], planted: dict[str, bool]) -> list[str]:
    """Unit propagation; when nothing is forced, choose the planted value (so no backtracking is shown)."""
    val: dict[int, bool] = {}
    lines = []
    n = len(planted)
    while len(val) < n:
        forced = None
        for i, cl in enumerate(clauses):
            if any(val.get(abs(l)) == (l > 0) for l in cl):
                continue
            free = [l for l in cl if abs(l) not in val]
            if len(free) == 1:
                forced = (free[0], i)
                break
        if forced:
            lit, i = forced
            val[abs(lit)] = lit > 0
            lines.append(f"x{abs(lit)}={int(lit > 0)} (forced by clause {i + 1})")
        else:
            v = next(i for i in range(1, n + 1) if i not in val)
            val[v] = planted[f"x{v}"]
            lines.append(f"x{v}={int(val[v])} (choice)")
    return lines


class LogicDeduction(SingleTurnEnv):
    name = "logic_deduction"
    domain = "logic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        gen = {"knights": _knights, "sat": _sat, "zebra": zebra.generate}[kind]
        prompt, world, hidden, stats = gen(rng, difficulty)
        hidden["kind"] = kind
        return Task(self.name, seed, difficulty, f"{prompt}\n{ANSWER_INSTRUCTION}", world, hidden, stats)

    def _consistent(self, task: Task, world: dict) -> bool:
        h = task.hidden
        if h["kind"] == "zebra":
            return zebra.consistent(h, world)
        if h["kind"] == "knights":
            return all(stmt_true(st, world) == world[s] for s, st in h["statements"])
        return all(any(world[f"x{abs(l)}"] == (l > 0) for l in cl) for cl in h["clauses"])

    def check(self, task: Task, span: str) -> bool:
        h = task.hidden
        if h["kind"] == "zebra":
            world = zebra.parse(h, span)
        elif h["kind"] == "knights":
            world = parse_assignment(span, h["names"], {"knight"}, {"knave"})
        else:
            world = parse_assignment(span, h["names"], {"1", "true", "t"}, {"0", "false", "f"})
        return self._consistent(task, world)

    def _render(self, task: Task, world: dict) -> str:
        if task.hidden["kind"] == "zebra":
            return zebra.render(task.hidden, world)
        if task.hidden["kind"] == "knights":
            return ", ".join(f"{x}={'knight' if v else 'knave'}" for x, v in world.items())
        return ", ".join(f"{x}={int(v)}" for x, v in world.items())

    def answer_text(self, task: Task) -> str:
        return self._render(task, task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        """Inconsistent assignments: single flips of the reference, then its complement."""
        if task.hidden["kind"] == "zebra":
            return [self._render(task, w) for w in self._zebra_wrong(task)[:3]]
        names = task.hidden["names"]
        cands = [{**task.answer, x: not task.answer[x]} for x in names]
        cands.append({x: not v for x, v in task.answer.items()})
        bad = [w for w in cands if not self._consistent(task, w)]
        if not bad:  # rare: every single flip is also a solution; search all assignments
            worlds = (dict(zip(names, bits)) for bits in itertools.product([False, True], repeat=len(names)))
            bad = [next(w for w in worlds if not self._consistent(task, w))]
        return [self._render(task, w) for w in bad[:3]]

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]

    def _zebra_wrong(self, task: Task) -> list[dict]:
        h = task.hidden
        out = zebra.wrong_candidates(h, task.answer)
        rng = random.Random(task.seed)
        while not out:  # every adjacent swap still fits the clues: look at random arrangements
            cand = {c: rng.sample(h["values"][c], h["houses"]) for c in h["cats"]}
            if not zebra.consistent(h, cand):
                out.append(cand)
        return out

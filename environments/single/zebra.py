"""Zebra (Einstein) puzzles for logic_deduction: houses in a row, attributes, clues.

A solution assigns each category's values to the houses (a permutation per
category); the checker accepts any assignment that satisfies every clue.
"""

from __future__ import annotations

import random
import re

CATEGORIES = {
    "color": (["red", "blue", "green", "white", "yellow"], "the person in the {} house"),
    "pet": (["cat", "dog", "fish", "bird", "horse"], "the {} owner"),
    "drink": (["tea", "coffee", "milk", "juice", "water"], "the {} drinker"),
}
Solution = dict[str, list[str]]  # category -> value in house 1..h


def _house(sol: Solution, value: str) -> int:
    return next(row.index(value) for row in sol.values() if value in row)


def clue_holds(clue: list, sol: Solution) -> bool:
    kind, a, b = clue
    ha = _house(sol, a)
    if kind == "at":
        return ha == b
    if kind == "not_at":
        return ha != b
    hb = _house(sol, b)
    return {"same": ha == hb, "next": abs(ha - hb) == 1, "left": ha + 1 == hb}[kind]


def _phrase(value: str) -> str:
    cat = next(c for c, (vals, _) in CATEGORIES.items() if value in vals)
    return CATEGORIES[cat][1].format(value)


def say(clue: list) -> str:
    kind, a, b = clue
    pa = _phrase(a)
    text = {
        "at": lambda: f"{pa} lives in house {b + 1}",
        "not_at": lambda: f"{pa} does not live in house {b + 1}",
        "same": lambda: f"{pa} is {_phrase(b)}",
        "next": lambda: f"{pa} lives next to {_phrase(b)}",
        "left": lambda: f"{pa} lives directly left of {_phrase(b)}",
    }[kind]()
    return text[0].upper() + text[1:] + "."


def generate(rng: random.Random, d: int) -> tuple[str, Solution, dict, dict]:
    houses, n_cats, n_clues = 2 + d // 3, 2 + (d >= 6), 2 + d
    cats = list(CATEGORIES)[:n_cats]
    sol = {c: rng.sample(CATEGORIES[c][0], houses) for c in cats}
    values = [v for c in cats for v in sol[c]]
    clues: list[list] = []
    while len(clues) < n_clues:
        kind = rng.choice(["at", "not_at", "same", "next", "left"])
        a, b = rng.sample(values, 2)
        if kind in ("same", "next"):  # symmetric: one spelling per pair, so duplicates are caught
            a, b = sorted((a, b))
        clue = [kind, a, rng.randrange(houses)] if kind in ("at", "not_at") else [kind, a, b]
        if kind == "same" and any(a in sol[c] and b in sol[c] for c in cats):
            continue  # two values of one category can never share a house
        if clue_holds(clue, sol) and clue not in clues:
            clues.append(clue)
    listing = "\n".join(f"{i + 1}. {say(c)}" for i, c in enumerate(clues))
    options = "; ".join(f"{c}: {', '.join(sorted(sol[c]))}" for c in cats)
    example = ", ".join(f"{c}=..." for c in cats)
    prompt = (
        f"{houses} houses stand in a row, numbered 1 to {houses} from left to right. Each house has one value of "
        f"each category ({options}), all different.\n{listing}\n"
        f"Answer with one line per house, like 1: {example}"
    )
    lines = solve_trace(cats, houses, clues, sol)
    hidden = {
        "cats": cats,
        "houses": houses,
        "clues": clues,
        "lines": lines,
        "values": {c: sorted(sol[c]) for c in cats},
    }
    return prompt, sol, hidden, {"entities": houses * n_cats, "constraints": n_clues}


def render(hidden: dict, sol: Solution) -> str:
    return "\n".join(
        f"{h + 1}: " + ", ".join(f"{c}={sol[c][h]}" for c in hidden["cats"]) for h in range(hidden["houses"])
    )


def parse(hidden: dict, span: str) -> Solution:
    """{category: values by house} from "1: color=red, pet=cat" lines; raises ValueError if malformed."""
    lines = [line.strip() for line in span.strip().splitlines() if line.strip()]
    if len(lines) != hidden["houses"]:
        raise ValueError("one line per house")
    sol: Solution = {c: [""] * hidden["houses"] for c in hidden["cats"]}
    for line in lines:
        m = re.fullmatch(r"(?:house\s*)?(\d+)\s*:\s*(.+)", line, re.IGNORECASE)
        if not m or not 1 <= int(m.group(1)) <= hidden["houses"]:
            raise ValueError("bad house line")
        h = int(m.group(1)) - 1
        for part in m.group(2).split(","):
            key, _, val = part.partition("=")
            key, val = key.strip().lower(), val.strip().lower()
            if key not in sol or sol[key][h]:
                raise ValueError("bad or repeated category")
            sol[key][h] = val
    for c in hidden["cats"]:
        if sorted(sol[c]) != hidden["values"][c]:
            raise ValueError(f"{c} is not a permutation of its values")
    return sol


def consistent(hidden: dict, sol: Solution) -> bool:
    return all(clue_holds(c, sol) for c in hidden["clues"])


def wrong_candidates(hidden: dict, sol: Solution) -> list[Solution]:
    """Swaps of two houses within one category that break at least one clue."""
    out = []
    for c in hidden["cats"]:
        for i in range(hidden["houses"] - 1):
            row = sol[c][:]
            row[i], row[i + 1] = row[i + 1], row[i]
            cand = {**sol, c: row}
            if not consistent(hidden, cand):
                out.append(cand)
    return out


def _narrow(clue: list, dom: dict[str, set[int]]) -> dict[str, set[int]]:
    """New domains (value -> possible houses) implied by one clue, sound for every solution."""
    kind, a, b = clue
    if kind == "at":
        return {a: dom[a] & {b}}
    if kind == "not_at":
        return {a: dom[a] - {b}}
    if kind == "same":
        both = dom[a] & dom[b]
        return {a: both, b: both}
    if kind == "next":
        return {a: {i for i in dom[a] if {i - 1, i + 1} & dom[b]}, b: {j for j in dom[b] if {j - 1, j + 1} & dom[a]}}
    return {a: {i for i in dom[a] if i + 1 in dom[b]}, b: {j for j in dom[b] if j - 1 in dom[a]}}  # left


def solve_trace(cats: list[str], houses: int, clues: list, sol: Solution) -> list[str]:
    """Candidate elimination: apply clues and one-value-per-house until nothing changes; when stuck,
    fix one value where the planted solution has it (propagation is sound, so that is always possible)."""
    dom = {v: set(range(houses)) for c in cats for v in sol[c]}
    lines: list[str] = []

    def show(v: str) -> str:
        return f"{v} in house {'/'.join(str(i + 1) for i in sorted(dom[v]))}"

    while any(len(d) > 1 for d in dom.values()):
        changed = False
        for i, clue in enumerate(clues):
            for v, new in _narrow(clue, dom).items():
                if new != dom[v]:
                    dom[v], changed = new, True
                    lines.append(f"clue {i + 1}: {show(v)}")
        for c in cats:  # a house holds one value per category
            for v in sol[c]:
                taken = {next(iter(dom[w])) for w in sol[c] if w != v and len(dom[w]) == 1}
                if dom[v] & taken and len(dom[v]) > 1:
                    dom[v] -= taken
                    changed = True
                    lines.append(f"one {c} per house: {show(v)}")
        if not changed:
            v = next(v for c in cats for v in sol[c] if len(dom[v]) > 1)
            dom[v] = {sol[next(c for c in cats if v in sol[c])].index(v)}
            lines.append(f"choose {show(v)}")
    return lines

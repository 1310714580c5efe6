"""Grid logic puzzles: sudoku (4x4, 6x6, 9x9) and futoshiki (latin square with inequalities).

D sets the grid size and the number of blank cells. Any grid that satisfies
every constraint and keeps every clue is accepted (puzzles need not have a
unique solution); there is no per-cell credit, so echoing the clues or a
nearly right grid scores 0.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

KINDS = ("sudoku", "futoshiki")
BLANKS = [4, 6, 8, 12, 15, 18, 24, 30, 36, 42]  # blank cells per difficulty 1..10
Grid = list[list[int]]


def sudoku_shape(d: int) -> tuple[int, int]:
    """(box rows, box cols): 2x2 boxes (4x4) for D <= 3, 2x3 (6x6) for D <= 6, else 3x3 (9x9)."""
    return (2, 2) if d <= 3 else (2, 3) if d <= 6 else (3, 3)


def futoshiki_side(d: int) -> int:
    return 4 if d <= 3 else 5 if d <= 6 else 6 if d <= 8 else 7


def full_sudoku(rng: random.Random, br: int, bc: int) -> Grid:
    """A solved grid from the base pattern, shuffled by digits, rows in bands, bands, columns in stacks, stacks."""
    n = br * bc
    digits = rng.sample(range(1, n + 1), n)
    bands = rng.sample(range(bc), bc)  # bc bands of br rows each
    rows = [b * br + r for b in bands for r in rng.sample(range(br), br)]
    stacks = rng.sample(range(br), br)  # br stacks of bc columns each
    cols = [s * bc + c for s in stacks for c in rng.sample(range(bc), bc)]
    return [[digits[(bc * (r % br) + r // br + c) % n] for c in cols] for r in rows]


def latin_square(rng: random.Random, n: int) -> Grid:
    digits = rng.sample(range(1, n + 1), n)
    rows, cols = rng.sample(range(n), n), rng.sample(range(n), n)
    return [[digits[(r + c) % n] for c in cols] for r in rows]


def is_perm(xs: list[int], n: int) -> bool:
    return sorted(xs) == list(range(1, n + 1))


def parse_grid(text: str, n: int) -> Grid:
    """n lines of n digits (space-separated, or run together when n <= 9); raises ValueError otherwise."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) != n:
        raise ValueError("wrong number of rows")
    grid = []
    for line in lines:
        toks = line.replace(",", " ").split() if (" " in line or "," in line) else list(line)
        if len(toks) != n or not all(t.isdigit() and len(t) <= 2 for t in toks):
            raise ValueError("bad row")
        grid.append([int(t) for t in toks])
    return grid


def render(grid: list[list[int | None]]) -> str:
    return "\n".join(" ".join(str(v) if v else "." for v in row) for row in grid)


class GridConstraintPuzzles(SingleTurnEnv):
    name = "grid_constraint_puzzles"
    domain = "logic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        blanks = BLANKS[difficulty - 1]
        if kind == "sudoku":
            br, bc = sudoku_shape(difficulty)
            n, sol, ineq = br * bc, full_sudoku(rng, br, bc), []
            rule = f"Fill the grid so that every row, every column and every {br}x{bc} box contains 1 to {n} once."
        else:
            n = futoshiki_side(difficulty)
            sol, (br, bc) = latin_square(rng, n), (0, 0)
            pairs = [((r, c), (r, c + 1)) for r in range(n) for c in range(n - 1)]
            pairs += [((r, c), (r + 1, c)) for r in range(n - 1) for c in range(n)]
            ineq = [
                [list(a), list(b)] if sol[a[0]][a[1]] < sol[b[0]][b[1]] else [list(b), list(a)]
                for a, b in rng.sample(pairs, n + difficulty)
            ]
            rule = (
                f"Fill the grid so that every row and every column contains 1 to {n} once and every inequality holds."
            )
        cells = rng.sample([(r, c) for r in range(n) for c in range(n)], blanks)
        puzzle = [row[:] for row in sol]
        for r, c in cells:
            puzzle[r][c] = 0
        text = render(puzzle)
        if ineq:
            text += "\nInequalities (rXcY is row X, column Y, counting from 1):\n" + "\n".join(
                f"r{a[0] + 1}c{a[1] + 1} < r{b[0] + 1}c{b[1] + 1}" for a, b in ineq
            )
        prompt = (
            f"{rule} Dots are empty cells.\n{text}\nAnswer with the completed grid: {n} lines of {n} digits "
            f"separated by spaces.\n{ANSWER_INSTRUCTION}"
        )
        hidden = {"kind": kind, "n": n, "box": [br, bc], "puzzle": puzzle, "ineq": ineq}
        return Task(self.name, seed, difficulty, prompt, sol, hidden, {"blanks": blanks, "cells": n * n})

    def check(self, task: Task, span: str) -> bool:
        h = task.hidden
        n = h["n"]
        g = parse_grid(span, n)
        if any(p and p != v for prow, row in zip(h["puzzle"], g) for p, v in zip(prow, row)):
            return False  # a clue was changed
        if not all(is_perm(row, n) for row in g) or not all(is_perm([row[c] for row in g], n) for c in range(n)):
            return False
        if h["kind"] == "sudoku":
            br, bc = h["box"]
            boxes = [
                [g[r][c] for r in range(R, R + br) for c in range(C, C + bc)]
                for R in range(0, n, br)
                for C in range(0, n, bc)
            ]
            return all(is_perm(b, n) for b in boxes)
        return all(g[a[0]][a[1]] < g[b[0]][b[1]] for a, b in h["ineq"])

    def answer_text(self, task: Task) -> str:
        return render(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        sol, puzzle = task.answer, task.hidden["puzzle"]
        swapped = [row[:] for row in sol]
        swapped[0], swapped[1] = swapped[1], swapped[0]  # valid-looking rows, clues broken or boxes broken
        clue_echo = render([[v or 1 for v in row] for row in puzzle])
        r, c = next((r, c) for r in range(len(puzzle)) for c in range(len(puzzle)) if not puzzle[r][c])
        one_off = [row[:] for row in sol]
        one_off[r][c] = one_off[r][c] % len(sol) + 1
        # several grids can be valid: keep only candidates that really fail
        return [t for t in (render(swapped), clue_echo, render(one_off)) if not self.check(task, t)]

    def solution_steps(self, task: Task) -> list[str]:
        """Fill cells in the order a human would: cells with a single candidate first."""
        h = task.hidden
        n, grid = h["n"], [row[:] for row in h["puzzle"]]
        lines = []
        while any(0 in row for row in grid):
            best = None
            for r in range(n):
                for c in range(n):
                    if not grid[r][c]:
                        cand = self._candidates(h, grid, r, c)
                        if best is None or len(cand) < len(best[2]):
                            best = (r, c, cand)
            r, c, cand = best
            v = task.answer[r][c]
            grid[r][c] = v
            why = "only option" if len(cand) == 1 else f"options {','.join(map(str, cand))}, choose"
            lines.append(f"r{r + 1}c{c + 1} = {v} ({why})")
        return lines

    @staticmethod
    def _candidates(h: dict, grid: Grid, r: int, c: int) -> list[int]:
        n = h["n"]
        used = set(grid[r]) | {grid[i][c] for i in range(n)}
        if h["kind"] == "sudoku":
            br, bc = h["box"]
            R, C = r - r % br, c - c % bc
            used |= {grid[i][j] for i in range(R, R + br) for j in range(C, C + bc)}
        cand = [v for v in range(1, n + 1) if v not in used]
        for a, b in h["ineq"]:
            if a == [r, c] and grid[b[0]][b[1]]:
                cand = [v for v in cand if v < grid[b[0]][b[1]]]
            if b == [r, c] and grid[a[0]][a[1]]:
                cand = [v for v in cand if v > grid[a[0]][a[1]]]
        return cand

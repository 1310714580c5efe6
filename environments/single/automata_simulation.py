"""Step simulations: elementary cellular automata, Game of Life, a tiny register machine.

D sets the number of steps and the size (tape width, grid side, program
length). The answer is the exact final tape, grid or register values; the
worked solution writes every intermediate state, one line (or grid) per step.
"""

from __future__ import annotations

import random
import re

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_int

KINDS = ("eca", "life", "register")
RULES = [30, 90, 110, 184, 60, 102, 150, 45, 54, 18]
REGS = "abc"


def eca_step(cells: str, rule: int) -> str:
    """Wrap-around elementary CA: new[i] = bit (4*left + 2*self + right) of the rule number."""
    n = len(cells)
    return "".join(
        str((rule >> (4 * int(cells[i - 1]) + 2 * int(cells[i]) + int(cells[(i + 1) % n]))) & 1) for i in range(n)
    )


def life_step(grid: list[str]) -> list[str]:
    """Conway's rules (B3/S23) with dead cells beyond the border."""
    n, m = len(grid), len(grid[0])

    def alive(r: int, c: int) -> int:
        return int(0 <= r < n and 0 <= c < m and grid[r][c] == "#")

    out = []
    for r in range(n):
        row = ""
        for c in range(m):
            k = sum(alive(r + dr, c + dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if dr or dc)
            row += "#" if k == 3 or (k == 2 and grid[r][c] == "#") else "."
        out.append(row)
    return out


def run_register(program: list[list], regs: dict[str, int], steps: int) -> tuple[dict[str, int], list[str]]:
    """Execute at most `steps` instructions (fewer if the program counter leaves the program)."""
    pc, lines = 0, []
    for i in range(steps):
        if not 0 <= pc < len(program):
            lines.append(f"step {i + 1}: halted")
            break
        op, *args = program[pc]
        line = pc + 1
        if op == "inc":
            regs[args[0]] += 1
        elif op == "dec":
            regs[args[0]] = max(0, regs[args[0]] - 1)
        elif op == "add":
            regs[args[0]] += regs[args[1]]
        if op == "jnz" and regs[args[0]] != 0:
            pc = args[1] - 1
        else:
            pc += 1
        state = " ".join(f"{r}={regs[r]}" for r in REGS)
        lines.append(f"step {i + 1}: line {line} {' '.join(map(str, [op, *args]))} -> {state}")
    return regs, lines


class AutomataSimulation(SingleTurnEnv):
    name = "automata_simulation"
    domain = "algorithmic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        d = difficulty
        h: dict = {"kind": kind}
        if kind == "eca":
            width, steps, rule = 7 + d, d, rng.choice(RULES)
            tape = "".join(rng.choice("01") for _ in range(width))
            states = [tape]
            for _ in range(steps):
                states.append(eca_step(states[-1], rule))
            answer: object = states[-1]
            table = ", ".join(f"{k:03b}->{(rule >> k) & 1}" for k in range(7, -1, -1))
            h["lines"] = [f"step {i}: {s}" for i, s in enumerate(states[1:], 1)]
            prompt = (
                f"Elementary cellular automaton rule {rule} on a ring of {width} cells (the ends are neighbours). "
                f"New cell from (left, self, right): {table}. Start: {tape}\n"
                f"What is the row after {steps} step{'s' if steps > 1 else ''}? Answer with the {width} digits."
            )
            stats = {"steps": steps, "size": width}
        elif kind == "life":
            side, steps = 4 + d // 2, d
            for _ in range(50):
                grid = ["".join("#" if rng.random() < 0.4 else "." for _ in range(side)) for _ in range(side)]
                states = [grid]
                for _ in range(steps):
                    states.append(life_step(states[-1]))
                if "#" in "".join(states[-1]):
                    break
            answer = "\n".join(states[-1])
            h["lines"] = [f"step {i}:\n" + "\n".join(g) for i, g in enumerate(states[1:], 1)]
            start = "\n".join(grid)
            prompt = (
                f"Game of Life on a {side}x{side} grid (# alive, . dead; cells outside the grid are dead). "
                "A live cell survives with 2 or 3 live neighbours; a dead cell with exactly 3 becomes alive.\n"
                f"{start}\n"
                f"What is the grid after {steps} step{'s' if steps > 1 else ''}? Answer with {side} lines of # and ."
            )
            stats = {"steps": steps, "size": side}
        else:
            n_lines, steps = 3 + d // 2, 3 * d
            program = []
            for i in range(n_lines):
                op = rng.choice(["inc", "inc", "dec", "add", "jnz"] if i else ["inc", "dec", "add"])
                r = rng.choice(REGS)
                if op == "add":
                    program.append([op, r, rng.choice([x for x in REGS if x != r])])
                elif op == "jnz":
                    program.append([op, r, rng.randint(1, i)])
                else:
                    program.append([op, r])
            start = {r: rng.randint(0, 4) for r in REGS}
            regs, h["lines"] = run_register(program, dict(start), steps)
            answer = regs
            listing = "\n".join(f"{i + 1}: {' '.join(map(str, ins))}" for i, ins in enumerate(program))
            prompt = (
                "A register machine runs this program, starting at line 1 with "
                + ", ".join(f"{r}={v}" for r, v in start.items())
                + ". inc r adds 1; dec r subtracts 1 (not below 0); add r s sets r to r+s; "
                "jnz r k jumps to line k if r is not 0; otherwise execution continues with the next line, "
                f"and it halts after the last line.\n{listing}\n"
                f"What are the registers after {steps} executed instructions (or at the halt, if sooner)? "
                "Answer like a=1, b=2, c=3."
            )
            stats = {"steps": steps, "size": n_lines}
        return Task(self.name, seed, difficulty, f"{prompt}\n{ANSWER_INSTRUCTION}", answer, h, stats)

    def check(self, task: Task, span: str) -> bool:
        kind = task.hidden["kind"]
        if kind == "eca":
            return span.replace(" ", "") == task.answer
        if kind == "life":
            rows = [line.replace(" ", "") for line in span.strip().splitlines() if line.strip()]
            return "\n".join(rows) == task.answer
        got = {}
        for part in span.split(","):
            m = re.fullmatch(r"\s*([a-c])\s*=\s*(\S+)\s*", part)
            if not m or m.group(1) in got:
                return False
            got[m.group(1)] = parse_int(m.group(2))
        return got == task.answer

    def answer_text(self, task: Task) -> str:
        if task.hidden["kind"] == "register":
            return ", ".join(f"{r}={v}" for r, v in task.answer.items())
        return task.answer

    def wrong_texts(self, task: Task) -> list[str]:
        kind, a = task.hidden["kind"], task.answer
        if kind == "eca":
            return [("1" if a[0] == "0" else "0") + a[1:], a[::-1] if a[::-1] != a else a[1:] + a[0]]
        if kind == "life":
            rows = a.split("\n")
            flipped = ("#" if rows[0][0] == "." else ".") + rows[0][1:]
            return ["\n".join([flipped] + rows[1:]), "\n".join(rows[:-1])]
        return [
            ", ".join(f"{r}={v + (i == 0)}" for i, (r, v) in enumerate(a.items())),
            ", ".join(f"{r}={v}" for r, v in list(a.items())[:2]),
        ]

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]

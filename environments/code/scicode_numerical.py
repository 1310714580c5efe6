"""scicode_numerical: a chain of numerical routines, one step per turn, each checked with allclose.

The chain works on one generated polynomial p: evaluate it (Horner),
differentiate it, integrate it (composite Simpson), find a root (Newton),
solve y' = p(t) - y (RK4), then a dominant eigenvalue (power iteration).
D sets the number of steps, the polynomial's degree and the hidden tests per
step. Each submission runs in the sandbox together with the earlier steps'
accepted code; outputs are compared in the parent (rtol 1e-6, atol 1e-8).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from environments.base import MultiTurnEnvironment, Score, StepResult, Task
from environments.code.harness import extract_code, fence, run_harness
from environments.turns import format_help, parse_action

RTOL, ATOL = 1e-6, 1e-8


def poly_eval(c, x):
    acc = 0.0
    for coef in reversed(c):
        acc = acc * x + coef
    return acc


def poly_deriv(c):
    return [i * c[i] for i in range(1, len(c))] or [0.0]


def simpson(c, a, b, n):
    h = (b - a) / n
    s = poly_eval(c, a) + poly_eval(c, b)
    s += sum((4 if i % 2 else 2) * poly_eval(c, a + i * h) for i in range(1, n))
    return s * h / 3


def newton(c, x0, tol, max_iter):
    d, x = poly_deriv(c), x0
    for _ in range(max_iter):
        step = poly_eval(c, x) / poly_eval(d, x)
        x -= step
        if abs(step) < tol:
            break
    return x


def rk4(c, y0, t_end, steps):
    h, t, y = t_end / steps, 0.0, y0
    f = lambda t, y: poly_eval(c, t) - y  # noqa: E731
    for _ in range(steps):
        k1 = f(t, y)
        k2 = f(t + h / 2, y + h * k1 / 2)
        k3 = f(t + h / 2, y + h * k2 / 2)
        k4 = f(t + h, y + h * k3)
        y += h * (k1 + 2 * k2 + 2 * k3 + k4) / 6
        t += h
    return y


def power_iteration(m, iters):
    v = [1.0] * len(m)
    for _ in range(iters):
        w = [sum(row[j] * v[j] for j in range(len(v))) for row in m]
        norm = math.sqrt(sum(x * x for x in w))
        v = [x / norm for x in w]
    mv = [sum(row[j] * v[j] for j in range(len(v))) for row in m]
    return sum(a * b for a, b in zip(v, mv)) / sum(a * a for a in v)


@dataclass(frozen=True)
class Step:
    func: str
    spec: str
    impl: Any  # trusted implementation in this module
    source: str  # the reference code for this step (shown only in worked solutions)


STEPS = [
    Step("poly_eval", "`poly_eval(c, x)`: the value of p(x) = c[0] + c[1]*x + ... + c[n]*x**n (use Horner's rule).",
         poly_eval, "def poly_eval(c, x):\n    acc = 0.0\n    for coef in reversed(c):\n        acc = acc * x + coef\n    return acc"),
    Step("poly_deriv", "`poly_deriv(c)`: the coefficient list of p'(x), same convention; a constant's derivative is [0.0].",
         poly_deriv, "def poly_deriv(c):\n    return [i * c[i] for i in range(1, len(c))] or [0.0]"),
    Step("simpson", "`simpson(c, a, b, n)`: the integral of p over [a, b] by the composite Simpson rule with n "
         "(even) subintervals of width h = (b - a) / n.", simpson,
         "def simpson(c, a, b, n):\n    h = (b - a) / n\n    s = poly_eval(c, a) + poly_eval(c, b)\n"
         "    s += sum((4 if i % 2 else 2) * poly_eval(c, a + i * h) for i in range(1, n))\n    return s * h / 3"),
    Step("newton", "`newton(c, x0, tol, max_iter)`: a root of p by Newton's method from x0: x <- x - p(x)/p'(x); stop "
         "after the first step whose size |p(x)/p'(x)| is below tol, or after max_iter steps; return x.", newton,
         "def newton(c, x0, tol, max_iter):\n    d, x = poly_deriv(c), x0\n    for _ in range(max_iter):\n"
         "        step = poly_eval(c, x) / poly_eval(d, x)\n        x -= step\n        if abs(step) < tol:\n            break\n    return x"),
    Step("rk4", "`rk4(c, y0, t_end, steps)`: y(t_end) for y' = p(t) - y, y(0) = y0, by the classical 4th-order "
         "Runge-Kutta method with `steps` equal steps.", rk4,
         "def rk4(c, y0, t_end, steps):\n    h, t, y = t_end / steps, 0.0, y0\n    f = lambda t, y: poly_eval(c, t) - y\n"
         "    for _ in range(steps):\n        k1 = f(t, y)\n        k2 = f(t + h / 2, y + h * k1 / 2)\n"
         "        k3 = f(t + h / 2, y + h * k2 / 2)\n        k4 = f(t + h, y + h * k3)\n"
         "        y += h * (k1 + 2 * k2 + 2 * k3 + k4) / 6\n        t += h\n    return y"),
    Step("power_iteration", "`power_iteration(m, iters)`: the dominant eigenvalue of the square matrix m (a list of "
         "rows): start from the all-ones vector, repeat `iters` times v <- m v / ||m v||_2, return the Rayleigh "
         "quotient (v . m v) / (v . v).", power_iteration,
         "import math\ndef power_iteration(m, iters):\n    v = [1.0] * len(m)\n    for _ in range(iters):\n"
         "        w = [sum(row[j] * v[j] for j in range(len(v))) for row in m]\n        norm = math.sqrt(sum(x * x for x in w))\n"
         "        v = [x / norm for x in w]\n    mv = [sum(row[j] * v[j] for j in range(len(v))) for row in m]\n"
         "    return sum(a * b for a, b in zip(v, mv)) / sum(a * a for a in v)"),
]  # fmt: skip


def _roots_poly(roots: list[int], scale: int) -> list[float]:
    """Coefficients (low to high) of scale * prod(x - r)."""
    c = [float(scale)]
    for r in roots:
        c = [a - r * b for a, b in zip([0.0] + c, c + [0.0])]
    return c


def _test_args(step: str, rng: random.Random, c: list[float], roots: list[int], n: int) -> list[list[Any]]:
    if step == "poly_eval":
        return [[c, round(rng.uniform(-3, 3), 3)] for _ in range(n)]
    if step == "poly_deriv":
        return [[c]] + [[[float(rng.randint(-5, 5)) for _ in range(rng.randint(1, 5))]] for _ in range(n - 1)]
    if step == "simpson":
        return [[c, round(rng.uniform(-2, 0), 2), round(rng.uniform(0.5, 2), 2), 2 * rng.randint(1, 20)] for _ in range(n)]
    if step == "newton":
        return [[c, rng.choice(roots) + rng.choice([-0.2, 0.15, 0.25]), 1e-12, 100] for _ in range(n)]
    if step == "rk4":
        return [[c, round(rng.uniform(-1, 1), 2), round(rng.uniform(0.2, 1.0), 2), rng.randint(5, 50)] for _ in range(n)]
    size = rng.randint(2, 4)
    mats = []
    for _ in range(n):  # symmetric with a dominant positive diagonal: power iteration converges
        a = [[0.0] * size for _ in range(size)]
        for i in range(size):
            for j in range(i, size):
                a[i][j] = a[j][i] = float(rng.randint(-2, 2)) if i != j else float(rng.randint(5, 12) + 6 * (i == 0))
        mats.append([a, 300])
    return mats


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want))
    return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, rel_tol=RTOL, abs_tol=ATOL)


@dataclass
class _Episode:
    step: int = 0  # index of the step being worked on
    turns: int = 0
    accepted: list[str] = field(default_factory=list)  # code of the passed steps, in order
    failed: dict[tuple[int, str], str] = field(default_factory=dict)  # (step, code) -> why: resubmissions are not rerun
    done: bool = False


class SciCodeNumerical(MultiTurnEnvironment):
    name: ClassVar[str] = "scicode_numerical"
    sandboxed = True  # runs model-written code
    domain: ClassVar[str] = "science code"
    max_turns: ClassVar[int] = 10
    max_concurrency: ClassVar[int] = 4
    score_timeout_s: ClassVar[float] = 60.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        n_steps, degree, n_tests = min(2 + (difficulty - 1) // 2, len(STEPS)), 2 + difficulty // 3, 2 + difficulty
        roots = rng.sample(range(-6, 7), degree)
        c = _roots_poly(roots, rng.choice([1, 2, 3, -1, -2]))
        steps = []
        for step in STEPS[:n_steps]:
            args = _test_args(step.func, rng, c, roots, n_tests)
            steps.append({"func": step.func, "args": args, "expected": [step.impl(*a) for a in args]})
        prompt = (
            f"You will implement {n_steps} numerical routines in Python, one per turn, for polynomials given as "
            "coefficient lists c (lowest degree first). Later steps may call the functions of earlier steps, which "
            "stay defined. Use only the standard library (math is fine), no input or printing.\n"
            f"Each turn, put the code of the current step between <answer> and </answer>. You have "
            f"{n_steps + 2} turns; a failed step may be resubmitted.\n\nStep 1: {STEPS[0].spec}"
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=[s.source for s in STEPS[:n_steps]],
            hidden={"steps": steps, "turn_budget": n_steps + 2},
            stats={"steps": float(n_steps), "degree": float(degree), "tests": float(n_tests),
                   "turn_budget": float(n_steps + 2)},
        )  # fmt: skip

    def reset(self, task: Task) -> _Episode:
        return _Episode()

    def step(self, task: Task, state: _Episode, model_turn: str) -> StepResult:
        steps = task.hidden["steps"]
        state.turns += 1
        out_of_turns = state.turns >= task.hidden["turn_budget"]
        action = parse_action(model_turn, ("answer",))
        code = extract_code(f"<answer>{action.body}</answer>") if action else None
        if code is None:
            state.done = out_of_turns
            return StepResult(format_help(("answer",)), state.done)
        why = state.failed.get((state.step, code)) or self._run_step(steps[state.step], state.accepted, code)
        if why:
            state.failed[(state.step, code)] = why
            state.done = out_of_turns
            return StepResult(f"Step {state.step + 1} failed ({why}). Fix it and resubmit.", state.done)
        state.accepted.append(code)
        state.step += 1
        if state.step == len(steps):
            state.done = True
            return StepResult("All steps passed.", True)
        state.done = out_of_turns
        return StepResult(f"Step {state.step} passed.\n\nStep {state.step + 1}: {STEPS[state.step].spec}", state.done)

    @staticmethod
    def _run_step(step: dict[str, Any], accepted: list[str], code: str) -> str:
        """Why the step fails its hidden tests ("" when it passes); run with the earlier steps' code."""
        run = run_harness("\n\n".join([*accepted, code]), "function", step["args"], func=step["func"])
        results = run.results or []
        passed = sum("error" not in r and _close(r.get("value"), e) for r, e in zip(results, step["expected"]))
        if run.results is None or passed < len(step["expected"]):
            return run.error or f"{passed}/{len(step['expected'])} hidden tests passed"
        return ""

    def score_episode(self, task: Task, state: _Episode) -> Score:
        total = len(task.hidden["steps"])
        return Score.binary(state.step == total, steps_passed=state.step / total, turns=float(state.turns))

    def reference_turns(self, task: Task) -> list[str]:
        return [fence(src) for src in task.answer]

    def bad_answers(self, task: Task) -> list[str]:
        from environments.base import join_turns

        wrong = "def poly_eval(c, x):\n    return sum(c) * x"
        ref = self.reference_turns(task)
        return [
            join_turns([fence(wrong)] * task.hidden["turn_budget"]),  # never passes step 1
            join_turns(ref[:-1]),  # stops one step short
            fence("print('PASSED')"),
            join_turns(ref[:-1] + ["<answer>```python\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n```</answer>"]),
        ]

    def worked_response(self, task: Task) -> str:
        parts = []
        for i, src in enumerate(task.answer):
            parts.append(f"Step {i + 1}: {STEPS[i].spec}\n{fence(src)}")
        return "\n\n".join(parts)

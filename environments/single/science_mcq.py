"""GPQA-style multiple choice from parameterised physics and chemistry problems.

Each family chains `steps` formulas; the distractors are the values a typical
mistake gives (a forgotten 1/2, series for parallel, an inverted ratio). D
sets the chain length, the number of options and the number of irrelevant
givens. The answer is one letter.
"""

from __future__ import annotations

import random
import re

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv

LETTERS = "ABCDEF"
_LETTER_RE = re.compile(r"\(?([A-Fa-f])[).]?")

IRRELEVANT = [
    "The lab is at an altitude of {n} m.",
    "The experiment is repeated {n} times.",
    "The ambient temperature is {n} degrees C.",
    "The notebook used has {n} pages.",
    "The apparatus sits on a table {n} cm high.",
    "The clock has a resolution of {n} ms.",
    "The observer stands {n} m away.",
    "The relative humidity is {n} percent.",
    "The measurement starts at {n} minutes past the hour.",
    "A second, unused container holds {n} L of water.",
]


def sig3(x: float) -> str:
    """x with three significant figures, never in exponent notation."""
    s = f"{x:.3g}"
    return f"{float(s):.0f}" if "e" in s else s


def kinematics(rng: random.Random, steps: int) -> tuple[list[str], float, list[float], str, list[str]]:
    v0, a, t, b = rng.randint(0, 20), rng.randint(1, 6), rng.randint(2, 12), rng.randint(2, 9)
    text = [f"A car moving at {v0} m/s accelerates uniformly at {a} m/s^2 for {t} s."]
    v = v0 + a * t
    lines = [f"v = v0 + a*t = {v0} + {a}*{t} = {v} m/s"]
    if steps == 1:
        return (
            text + ["What is its speed at the end of the acceleration?"],
            v,
            [a * t, v0 + a / t, v0 * a * t + 1],
            "m/s",
            lines,
        )
    d1 = v0 * t + 0.5 * a * t * t
    lines.append(f"d1 = v0*t + a*t^2/2 = {sig3(d1)} m")
    if steps == 2:
        return (
            text + ["How far does it travel while accelerating?"],
            d1,
            [v0 * t + a * t * t, 0.5 * a * t * t, v * t],
            "m",
            lines,
        )
    text.append(f"It then brakes at {b} m/s^2 until it stops.")
    d2 = v * v / (2 * b)
    total = d1 + d2
    lines.append(f"d2 = v^2/(2b) = {v}^2/(2*{b}) = {sig3(d2)} m; total = {sig3(total)} m")
    if steps == 3:
        return (
            text + ["What total distance does it cover?"],
            total,
            [d1 + v * v / b, d1, v0 * t + a * t * t + d2],
            "m",
            lines,
        )
    t2 = v / b
    avg = total / (t + t2)
    lines.append(f"braking time = v/b = {sig3(t2)} s; average speed = {sig3(total)}/{sig3(t + t2)} = {sig3(avg)} m/s")
    return (
        text + ["What is its average speed over the whole trip?"],
        avg,
        [(v0 + v) / 2, total / t, v / 2],
        "m/s",
        lines,
    )


def circuit(rng: random.Random, steps: int) -> tuple[list[str], float, list[float], str, list[str]]:
    volts = rng.choice([6, 9, 12, 18, 24])
    r1, r2, r3 = rng.randint(2, 20), rng.randint(2, 30), rng.randint(2, 30)
    if steps == 1:
        i = volts / r1
        text = [f"A battery of {volts} V is connected across a {r1} ohm resistor."]
        return (
            text + ["What current flows?"],
            i,
            [volts * r1, r1 / volts, volts / (r1 + 1)],
            "A",
            [f"I = V/R = {volts}/{r1} = {sig3(i)} A"],
        )
    if steps == 2:
        i = volts / (r1 + r2)
        text = [f"A battery of {volts} V drives resistors of {r1} ohm and {r2} ohm in series."]
        par = r1 * r2 / (r1 + r2)
        lines = [f"R = {r1} + {r2} = {r1 + r2} ohm", f"I = {volts}/{r1 + r2} = {sig3(i)} A"]
        return text + ["What current flows?"], i, [volts / r1, volts / par, volts * (r1 + r2) / 100], "A", lines
    par = r2 * r3 / (r2 + r3)
    req = r1 + par
    i = volts / req
    text = [
        f"A battery of {volts} V drives a {r1} ohm resistor in series with a parallel pair of {r2} ohm and {r3} ohm."
    ]
    lines = [
        f"parallel: {r2}*{r3}/({r2}+{r3}) = {sig3(par)} ohm",
        f"R = {r1} + {sig3(par)} = {sig3(req)} ohm",
        f"I = {volts}/{sig3(req)} = {sig3(i)} A",
    ]
    if steps == 3:
        return (
            text + ["What current leaves the battery?"],
            i,
            [volts / (r1 + r2 + r3), volts / r1, volts / par],
            "A",
            lines,
        )
    p = i * i * r1
    lines.append(f"P = I^2 R1 = {sig3(i)}^2*{r1} = {sig3(p)} W")
    wrong = [volts * volts / r1, i * r1, (volts / (r1 + r2 + r3)) ** 2 * r1]
    return text + [f"What power is dissipated in the {r1} ohm resistor?"], p, wrong, "W", lines


REACTIONS = [
    # (reactant, M_r, product, M_p, moles product per mole reactant, equation)
    ("H2", 2.0, "H2O", 18.0, 1.0, "2 H2 + O2 -> 2 H2O"),
    ("CH4", 16.0, "CO2", 44.0, 1.0, "CH4 + 2 O2 -> CO2 + 2 H2O"),
    ("C3H8", 44.0, "CO2", 44.0, 3.0, "C3H8 + 5 O2 -> 3 CO2 + 4 H2O"),
    ("N2", 28.0, "NH3", 17.0, 2.0, "N2 + 3 H2 -> 2 NH3"),
    ("Al", 27.0, "Al2O3", 102.0, 0.5, "4 Al + 3 O2 -> 2 Al2O3"),
]


def stoichiometry(rng: random.Random, steps: int) -> tuple[list[str], float, list[float], str, list[str]]:
    re_, mr, pr, mp, ratio, eq = rng.choice(REACTIONS)
    mass = rng.randint(2, 60) * 2
    n = mass / mr
    text = [f"Consider the reaction {eq}. A sample of {mass} g of {re_} (molar mass {mr:g} g/mol) reacts completely."]
    lines = [f"n({re_}) = {mass}/{mr:g} = {sig3(n)} mol"]
    if steps == 1:
        return text + [f"How many moles of {re_} react?"], n, [mass * mr, mr / mass, mass / (mr + 1) / 2], "mol", lines
    npr = n * ratio
    lines.append(f"n({pr}) = {sig3(n)} * {ratio:g} = {sig3(npr)} mol")
    if steps == 2:
        wrong = [n / ratio if ratio != 1 else n * 2, n, n * ratio * 2 + 0.1]
        return text + [f"How many moles of {pr} form?"], npr, wrong, "mol", lines
    m = npr * mp
    lines.append(f"m({pr}) = {sig3(npr)} * {mp:g} = {sig3(m)} g")
    text.append(f"The molar mass of {pr} is {mp:g} g/mol.")
    if steps == 3:
        wrong = [n * mp, (n / ratio if ratio != 1 else 2 * n) * mp, mass * ratio]
        return text + [f"What mass of {pr} forms?"], m, wrong, "g", lines
    y = rng.choice([50, 60, 75, 80, 90])
    text.append(f"The actual yield is {y} percent.")
    lines.append(f"actual = {sig3(m)} * {y}/100 = {sig3(m * y / 100)} g")
    return (
        text + [f"What mass of {pr} is actually obtained?"],
        m * y / 100,
        [m / (y / 100), m, m * (1 - y / 100)],
        "g",
        lines,
    )


def heating(rng: random.Random, steps: int) -> tuple[list[str], float, list[float], str, list[str]]:
    m, t0, t1 = rng.randint(1, 9) / 2, rng.randint(10, 30), rng.randint(40, 95)
    c = 4180
    q = m * c * (t1 - t0)
    text = [f"{m:g} kg of water (specific heat 4180 J/(kg K)) is heated from {t0} C to {t1} C."]
    lines = [f"Q = m c dT = {m:g}*4180*{t1 - t0} = {sig3(q)} J"]
    if steps == 1:
        return (
            text + ["How much heat does the water absorb?"],
            q,
            [m * c * t1, m * c * (t1 + t0), c * (t1 - t0)],
            "J",
            lines,
        )
    p = rng.choice([500, 800, 1000, 1500, 2000])
    text.append(f"The heater delivers {p} W.")
    t = q / p
    lines.append(f"t = Q/P = {sig3(q)}/{p} = {sig3(t)} s")
    if steps == 2:
        return text + ["How long does the heating take?"], t, [q * p / 1e6, m * c * t1 / p, t / 60], "s", lines
    eta = rng.choice([50, 60, 70, 80, 90])
    text.append(f"Only {eta} percent of the heater's energy reaches the water.")
    t = q / (p * eta / 100)
    lines.append(f"t = Q/(P*eta) = {sig3(q)}/({p}*{eta / 100:g}) = {sig3(t)} s")
    if steps == 3:
        return text + ["How long does the heating take?"], t, [q / p, q * (eta / 100) / p, t / 60], "s", lines
    kwh = t * p / 3.6e6
    lines.append(f"E = P*t = {p}*{sig3(t)} J = {sig3(kwh)} kWh")
    return (
        text + ["How much electrical energy is used, in kWh?"],
        kwh,
        [q / 3.6e6, kwh * 1000, t * p / 1e6],
        "kWh",
        lines,
    )


FAMILIES = (kinematics, circuit, stoichiometry, heating)


class ScienceMcq(SingleTurnEnv):
    name = "science_mcq"
    domain = "science"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        family = FAMILIES[seed % len(FAMILIES)]
        steps = 1 + (difficulty - 1) // 3
        n_opts = 4 if difficulty <= 4 else 5 if difficulty <= 7 else 6
        text, correct, wrong, unit, lines = family(rng, steps)
        right = sig3(correct)
        values = [right]
        for w in wrong + [correct * f for f in (2, 0.5, 3, 1.5, 0.25, 4)]:
            s = sig3(w)
            if s not in values and float(s) > 0 and abs(w - correct) > 0.03 * abs(correct):
                values.append(s)
        options = values[:n_opts]
        rng.shuffle(options)
        letter = LETTERS[options.index(right)]
        facts = [f.format(n=rng.randint(2, 59)) for f in rng.sample(IRRELEVANT, difficulty - 1)]
        body = text[:-1] + facts
        opts = "\n".join(f"{LETTERS[i]}) {v} {unit}" for i, v in enumerate(options))
        prompt = (
            " ".join(body) + f" {text[-1]}\n{opts}\n"
            f"Answer with the letter of the correct option only.\n{ANSWER_INSTRUCTION}"
        )
        lines = lines + [f"{right} {unit} is option {letter}."]
        stats = {"steps": steps, "options": n_opts, "irrelevant_givens": difficulty - 1}
        return Task(self.name, seed, difficulty, prompt, letter, {"lines": lines, "n_opts": n_opts}, stats)

    def check(self, task: Task, span: str) -> bool:
        m = _LETTER_RE.fullmatch(span.strip())
        return bool(m) and m.group(1).upper() == task.answer

    def answer_text(self, task: Task) -> str:
        return task.answer

    def wrong_texts(self, task: Task) -> list[str]:
        return [c for c in LETTERS[: task.hidden["n_opts"]] if c != task.answer]

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]

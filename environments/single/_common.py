"""Shared pieces of the single-turn environments: a scoring skeleton and safe parsers.

Model output is untrusted text. Nothing here calls `eval`, `exec` or `sympify`
on it: numbers go through `Fraction` on regex-validated strings and
polynomials through a small recursive-descent parser of our own, with caps on
length, degree and term count so a hostile answer stays cheap to reject.
"""

from __future__ import annotations

import abc
import re
from fractions import Fraction
from typing import ClassVar

from environments.base import ANSWER_INSTRUCTION, Environment, Score, Task, extract_answer

__all__ = [
    "ANSWER_INSTRUCTION",
    "SingleTurnEnv",
    "wrap",
    "parse_int",
    "parse_number",
    "parse_list",
    "fmt_num",
    "Poly",
    "parse_poly",
    "parse_expanded_poly",
    "poly_str",
]


def wrap(text: str) -> str:
    """`text` between answer tags."""
    return f"<answer>{text}</answer>"


class SingleTurnEnv(Environment):
    """An environment whose reward is one strict check of the extracted answer span.

    Subclasses implement `check` (bool, or (bool, logged components)),
    `answer_text` (the reference answer span), `wrong_texts` (well-formed wrong
    spans) and `solution_steps` (lines of a short worked solution).
    """

    # Longer answer spans are rejected before parsing (parsers stay cheap).
    max_answer_chars: ClassVar[int] = 20_000

    @abc.abstractmethod
    def check(self, task: Task, span: str) -> bool | tuple[bool, dict[str, float]]:
        """Whether the answer span is correct; may raise on malformed text."""

    @abc.abstractmethod
    def answer_text(self, task: Task) -> str:
        """The reference answer span."""

    @abc.abstractmethod
    def wrong_texts(self, task: Task) -> list[str]:
        """Well-formed answer spans that are wrong."""

    def solution_steps(self, task: Task) -> list[str]:
        """Lines of a worked solution (before the answer)."""
        return []

    def score(self, task: Task, completion: str) -> Score:
        span = extract_answer(completion) if isinstance(completion, str) else None
        if span is None or len(span) > self.max_answer_chars:
            return Score.zero(format=0.0)
        try:
            result = self.check(task, span)
        except Exception:  # untrusted text: any parse failure is a wrong answer, never a crash
            return Score.zero(format=1.0, parse_error=1.0)
        ok, comps = result if isinstance(result, tuple) else (result, {})
        return Score.binary(bool(ok), format=1.0, **comps)

    def reference_solution(self, task: Task) -> str:
        return wrap(self.answer_text(task))

    def bad_answers(self, task: Task) -> list[str]:
        # Candidates are built by perturbing the reference; a perturbation can land on another
        # correct answer (a rotation of a periodic tape, another valid grid), so those are dropped.
        out = [wrap(t) for t in dict.fromkeys(self.wrong_texts(task)) if t.strip()]
        return [c for c in out if self.score(task, c).reward == 0.0]

    def worked_solution(self, task: Task) -> str:
        steps = "\n".join(self.solution_steps(task))
        body = f"{steps}\n" if steps else ""
        return f"{task.prompt}\n\n{body}{self.reference_solution(task)}"


# ---------------------------------------------------------------- numbers

_INT_RE = re.compile(r"[+-]?(\d+|\d{1,3}(,\d{3})+)")
_DEC_RE = re.compile(r"[+-]?\d*\.\d+|[+-]?\d+\.?")
_FRAC_RE = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")


def parse_int(text: str) -> int:
    """A plain integer ("-12", "1,234"); raises ValueError otherwise."""
    s = text.strip()
    if len(s) > 400 or not _INT_RE.fullmatch(s):
        raise ValueError(f"not an integer: {text[:40]!r}")
    return int(s.replace(",", ""))


def parse_number(text: str) -> Fraction:
    """An exact rational from "7", "-3/4" or "0.25"; raises ValueError otherwise."""
    s = text.strip()
    if len(s) > 400:
        raise ValueError("number too long")
    m = _FRAC_RE.fullmatch(s)
    if m:
        den = int(m.group(2))
        if den == 0:
            raise ValueError("zero denominator")
        return Fraction(int(m.group(1)), den)
    if _INT_RE.fullmatch(s):
        return Fraction(int(s.replace(",", "")))
    if _DEC_RE.fullmatch(s):
        return Fraction(s)
    raise ValueError(f"not a number: {text[:40]!r}")


def parse_list(text: str, sep: str = ",") -> list[str]:
    """Items of "a, b, c" (optional surrounding brackets), stripped; empty items rejected."""
    s = text.strip()
    if len(s) >= 2 and s[0] + s[-1] in ("[]", "()", "{}"):
        s = s[1:-1]
    items = [t.strip() for t in s.split(sep)]
    if any(not t for t in items):
        raise ValueError("empty list item")
    return items


def fmt_num(x: Fraction | int) -> str:
    """An exact number as "7" or "-3/4"."""
    x = Fraction(x)
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


# ---------------------------------------------------------------- polynomials

Monomial = tuple[tuple[str, int], ...]  # sorted ((var, exponent), ...); () is the constant
Poly = dict[Monomial, Fraction]

_TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([a-z])|(\*\*|[-+*/^()]))")
_MAX_DEGREE = 40
_MAX_TERMS = 400
_MAX_PRODUCT = 5000  # term pairs per multiplication; real answers here need < 200


def _tokens(text: str) -> list[str]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad character at {pos}")
        out.append(m.group(1) or m.group(2) or ("^" if m.group(3) == "**" else m.group(3)))
        pos = m.end()
    return out


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps: dict[str, int] = dict(a)
    for v, e in b:
        exps[v] = exps.get(v, 0) + e
    if sum(exps.values()) > _MAX_DEGREE:
        raise ValueError("degree too high")
    return tuple(sorted(exps.items()))


def poly_add(p: Poly, q: Poly, sign: int = 1) -> Poly:
    out = dict(p)
    for m, c in q.items():
        out[m] = out.get(m, Fraction(0)) + sign * c
    return {m: c for m, c in out.items() if c != 0}


def poly_mul(p: Poly, q: Poly) -> Poly:
    if len(p) * len(q) > _MAX_PRODUCT:
        raise ValueError("product too large")
    out: Poly = {}
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            m = _mono_mul(m1, m2)
            out[m] = out.get(m, Fraction(0)) + c1 * c2
    if len(out) > _MAX_TERMS:
        raise ValueError("too many terms")
    return {m: c for m, c in out.items() if c != 0}


class _PolyParser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/'|implicit) unary)* ;
    unary := ('-'|'+') unary | power ; power := atom ('^' int)? ; atom := number | var | '(' expr ')'.

    Division is by nonzero constants only; `terms` records the top-level terms
    of a parenthesis-free expression (for the expanded-form check).
    """

    def __init__(self, text: str) -> None:
        if len(text) > 2000:
            raise ValueError("expression too long")
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0
        self.terms: list[Poly] = []

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end")
        self.i += 1
        return tok

    def parse(self) -> Poly:
        p = self.expr(top=True)
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return p

    def expr(self, top: bool = False) -> Poly:
        self.depth += 1
        if self.depth > 50:
            raise ValueError("nesting too deep")
        p = self.term()
        if top:
            self.terms.append(p)
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            t = self.term()
            if top:
                self.terms.append({m: sign * c for m, c in t.items()})
            p = poly_add(p, t, sign)
        self.depth -= 1
        return p

    def term(self) -> Poly:
        p = self.unary()
        while True:
            tok = self.peek()
            if tok in ("*", "/"):
                self.take()
                q = self.unary()
                if tok == "/":
                    if len(q) != 1 or () not in q:
                        raise ValueError("division by a non-constant")
                    p = {m: c / q[()] for m, c in p.items()}
                else:
                    p = poly_mul(p, q)
            elif tok is not None and (tok == "(" or tok.isalnum()):
                p = poly_mul(p, self.unary())  # implicit multiplication: 2x, x(y+1), (x+1)(x-1)
            else:
                return p

    def unary(self) -> Poly:
        if self.peek() in ("-", "+"):
            sign = 1 if self.take() == "+" else -1
            return {m: sign * c for m, c in self.unary().items()}
        return self.power()

    def power(self) -> Poly:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exp_tok = self.take()
            if not exp_tok.isdigit() or int(exp_tok) > _MAX_DEGREE:
                raise ValueError("exponent must be a small non-negative integer")
            out: Poly = {(): Fraction(1)}
            for _ in range(int(exp_tok)):
                out = poly_mul(out, base)
            return out
        return base

    def atom(self) -> Poly:
        tok = self.take()
        if tok == "(":
            p = self.expr()
            if self.take() != ")":
                raise ValueError("missing )")
            return p
        if tok[0].isdigit():
            c = Fraction(tok)
            return {(): c} if c != 0 else {}
        if tok.isalpha():
            return {((tok, 1),): Fraction(1)}
        raise ValueError(f"unexpected {tok!r}")


def parse_poly(text: str) -> Poly:
    """Normal form (monomial -> nonzero rational coefficient) of a polynomial expression."""
    return _PolyParser(text).parse()


def parse_expanded_poly(text: str) -> Poly:
    """Like `parse_poly`, but the text must already be expanded: no parentheses, like terms combined."""
    if "(" in text or ")" in text:
        raise ValueError("not expanded: parentheses")
    parser = _PolyParser(text)
    poly = parser.parse()
    keys = [next(iter(t)) for t in parser.terms if t]
    if len(keys) != len(set(keys)) or any(len(t) > 1 for t in parser.terms):
        raise ValueError("not expanded: like terms not combined")
    return poly


def _mono_str(m: Monomial) -> str:
    return "*".join(v if e == 1 else f"{v}^{e}" for v, e in m)


def poly_str(p: Poly) -> str:
    """Canonical text of a polynomial: descending total degree, then variable order."""
    if not p:
        return "0"
    parts = []
    for m in sorted(p, key=lambda m: (-sum(e for _, e in m), [(v, -e) for v, e in m])):
        c = p[m]
        mono = _mono_str(m)
        mag = abs(c)
        if mono and mag == 1:
            body = mono
        elif mono:
            body = f"{fmt_num(mag)}*{mono}" if mag.denominator != 1 else f"{mag}{mono}"
        else:
            body = fmt_num(mag)
        parts.append(("-" if c < 0 else "+", body))
    sign0, body0 = parts[0]
    out = ("-" if sign0 == "-" else "") + body0
    for sign, body in parts[1:]:
        out += f" {sign} {body}"
    return out

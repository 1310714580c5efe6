"""Answer verifiers of the dataset environments, by name, and the shared math checker.

    math         symbolic equivalence through math-verify (LaTeX, \\boxed{}, fractions, decimals, units)
    exact        the answer text equals the expected text (whitespace collapsed)
    regex        the answer fully matches the expected column read as a regular expression
    json_schema  the answer is JSON valid under the expected column read as a JSON Schema
    code_tests   the answer is a program; the expected column holds tests run in the sandbox
    module:fn    a user function fn(response, expected, row) -> bool | float in [0, 1]

Model output is untrusted. The math checker accepts one answer only: a span
that still holds words after its wrappers (`$`, `\\boxed{}`, a trailing unit)
are removed, or several comma-separated values outside brackets, scores 0
(math-verify alone would pick a number out of "5 or 55"). math-verify bounds
its time with SIGALRM, which works only on a process's main thread: here it
gets a timeout on the main thread and none elsewhere, where the scoring pool's
per-job timeout (a killed worker process) bounds it instead.
"""

from __future__ import annotations

import abc
import functools
import importlib
import json
import logging
import re
import threading
from fractions import Fraction
from typing import Any, Callable, ClassVar

MAX_SPAN_CHARS = 2_000  # longer answer spans are wrong before any parsing (keeps sympy cheap)
MATH_TIMEOUT_S = 5  # math-verify's own limit, main thread only


# ---------------------------------------------------------------- the math checker

_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[+-]?\.\d+")
_FRACTION_RE = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")
# a trailing unit: \text{...} or a word of two or more letters after a space ("55 dollars"), or % / °
_UNIT_TAIL_RE = re.compile(r"^(.*?[\d}).])(?:\s*\\(?:text|mathrm|textbf|mbox)\{[^{}]*\}|\s+[A-Za-z]{2,}\.?|\s*[%°])$")
_VAR_PREFIX_RE = re.compile(r"^[A-Za-z]\s*=\s*(?=\S)")
_LATEX_CMD_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_LATEX_FRAC_RE = re.compile(r"([+-]?)\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_SCI_RE = re.compile(r"(.+?)\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([+-]?\d{1,3})\s*\}?")
_FENCE_RE = re.compile(r"^```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _unwrap_command(s: str, command: str) -> str:
    """`\\boxed{X}` -> `X` when the whole text is one such command (braces balanced)."""
    if not (s.startswith(command + "{") and s.endswith("}")):
        return s
    depth = 0
    for i, ch in enumerate(s[len(command):], start=len(command)):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return s[len(command) + 1 : -1].strip() if i == len(s) - 1 else s
    return s


def strip_wrappers(span: str) -> str:
    """Remove math delimiters ($, \\(, \\[), a \\boxed{} around the whole span and a final period."""
    s = span.strip()
    for _ in range(3):  # wrappers may nest: $\boxed{55}$
        before = s
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
        for cmd in ("\\boxed", "\\fbox"):
            s = _unwrap_command(s, cmd)
        s = s.rstrip(".").strip()
        if s == before:
            break
    return s


def normalise_math(span: str) -> str:
    """`strip_wrappers`, then a leading `x =` and a trailing unit ("55 dollars", "55\\text{ cm}", "55%")."""
    s = strip_wrappers(span)
    s = _VAR_PREFIX_RE.sub("", s)
    m = _UNIT_TAIL_RE.match(s)
    return strip_wrappers(m.group(1)) if m else s


def single_answer(s: str) -> bool:
    """False for a span that holds prose or several values (a hedge), after `normalise_math`."""
    if _WORD_RE.search(_LATEX_CMD_RE.sub(" ", s)):
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and ch in ",;":
            # a thousands separator (1,234) is fine; a list of answers is not
            if not (re.match(r"\d{3}(?!\d)", s[i + 1 : i + 5]) and i > 0 and s[i - 1].isdigit()):
                return False
    return True


def exact_number(s: str) -> Fraction | None:
    """An exact rational from "55", "-1,234", "55.0", "3/4"; None for anything else."""
    m = _FRACTION_RE.fullmatch(s)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    if _NUMBER_RE.fullmatch(s):
        return Fraction(s.replace(",", ""))
    return None


def latex_number(s: str) -> Fraction | None:
    """`exact_number`, or a LaTeX fraction (\\frac{3}{4}, -\\dfrac{6}{8}) or scientific notation (5.5 \\times 10^{1})."""
    n = exact_number(s)
    if n is not None:
        return n
    m = _LATEX_FRAC_RE.fullmatch(s)
    if m:
        den = int(m.group(3))
        return (Fraction(int(m.group(2)), den) * (-1 if m.group(1) == "-" else 1)) if den else None
    m = _SCI_RE.fullmatch(s)
    if m:
        mantissa = exact_number(m.group(1).strip())
        return None if mantissa is None else mantissa * Fraction(10) ** int(m.group(2))
    return None


def _mv_timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.cache
def _math_verify():
    import math_verify

    for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)  # its "timeout disabled" notice, once per process
    config = [math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig()]
    return math_verify, config


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    mv, config = _math_verify()
    return mv.parse(gold, extraction_config=config, parsing_timeout=_mv_timeout())


def parse_math(text: str):
    """math-verify's parse of `text` (LaTeX first, then plain expressions); [] when nothing parses."""
    mv, config = _math_verify()
    return mv.parse(text, extraction_config=config, parsing_timeout=_mv_timeout())


def math_equal(response: str, gold: str, strict: bool = True) -> bool:
    """Whether `response` states the same mathematical answer as `gold`.

    strict (answer spans): one value only (see `single_answer`); when the gold answer is a
    number, the response must be a number too (55, 55.0, 1,234, 3/4, \\frac{3}{4}, 5.5 \\times 10^{1}),
    compared exactly as rationals without sympy (an echoed expression is not an answer). Not strict (a whole completion): math-verify's
    own extraction picks the answer (the last \\boxed{}, "the answer is ...").
    """
    if not isinstance(response, str) or len(response) > (MAX_SPAN_CHARS if strict else 50 * MAX_SPAN_CHARS):
        return False
    gold_s = normalise_math(str(gold))
    if strict:
        response = normalise_math(response)
        if not response or not single_answer(response):
            return False
        b = latex_number(gold_s)
        if b is not None:  # a number is asked: the answer is a number, not an expression that evaluates to it
            a = latex_number(response)
            return a is not None and a == b
        response = response if response.startswith("$") else f"${response}$"
    mv, _ = _math_verify()
    gold_parsed = _parse_gold(gold_s if gold_s.startswith("$") else f"${gold_s}$")
    if not gold_parsed:
        gold_parsed = _parse_gold(str(gold))
    pred = parse_math(response)
    if not gold_parsed or not pred:
        return False
    return bool(mv.verify(gold_parsed, pred, timeout_seconds=_mv_timeout()))


# ---------------------------------------------------------------- verifiers by name


class Verifier(abc.ABC):
    """Checks a response (the <answer> span, or the whole completion) against a row's expected value."""

    name: ClassVar[str]

    def prepare(self, expected: Any) -> Any:
        """The expected value in the form `verify` wants; ValueError for a value this verifier cannot use
        (raised when the dataset is loaded, so a bad row is named before any engine starts)."""
        if not isinstance(expected, str) or not expected.strip():
            raise ValueError(f"expected a non-empty string, got {type(expected).__name__} {str(expected)[:40]!r}")
        return expected

    @abc.abstractmethod
    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool | float:
        """True/1.0 when the response is right; may raise on malformed text (scored 0, flagged)."""

    def reference(self, expected: Any) -> str | None:
        """A response that must score 1 (for `elr-rl envs check`); None when only a solution column can tell."""
        return None

    def counterfactuals(self, expected: Any) -> list[str]:
        """Well-formed wrong responses that must score 0."""
        return []


class MathVerifier(Verifier):
    name = "math"
    strict = True  # set per dataset: False when the whole completion is checked

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool:
        return math_equal(response, expected, strict=self.strict)

    def reference(self, expected: Any) -> str:
        return str(expected).strip()

    def counterfactuals(self, expected: Any) -> list[str]:
        s = normalise_math(str(expected))
        n = exact_number(s)
        if n is not None:
            return [str(n + 1), str(-n - 2)]
        return [f"{s} + 1"]


class ExactVerifier(Verifier):
    name = "exact"

    @staticmethod
    def _norm(s: str) -> str:
        return " ".join(s.split())

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool:
        return self._norm(response) == self._norm(expected)

    def reference(self, expected: Any) -> str:
        return str(expected)

    def counterfactuals(self, expected: Any) -> list[str]:
        return [str(expected) + " x", "x" + str(expected)]


class RegexVerifier(Verifier):
    name = "regex"

    def prepare(self, expected: Any) -> re.Pattern[str]:
        pattern = super().prepare(expected)
        try:
            return re.compile(pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}): {pattern[:60]!r}") from None

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool:
        pattern = expected if isinstance(expected, re.Pattern) else re.compile(expected, re.DOTALL)
        return pattern.fullmatch(response.strip()) is not None

    def counterfactuals(self, expected: Any) -> list[str]:
        return ["\x00 no match \x00"]


class JsonSchemaVerifier(Verifier):
    name = "json_schema"

    def prepare(self, expected: Any) -> dict[str, Any]:
        import jsonschema

        schema = json.loads(super().prepare(expected)) if isinstance(expected, str) else expected
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON Schema must be an object, got {type(schema).__name__}")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        return schema

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool:
        import jsonschema

        schema = expected if isinstance(expected, dict) else json.loads(expected)
        try:
            value = json.loads(response)
        except (ValueError, RecursionError):
            return False
        validator = jsonschema.validators.validator_for(schema)(schema)
        return validator.is_valid(value)

    def counterfactuals(self, expected: Any) -> list[str]:
        return ["not json {"]


class CodeTestsVerifier(Verifier):
    """Tests in the APPS layout: {"inputs": [...], "outputs": [...], "fn_name": optional}.

    Without fn_name each input is a program's stdin and the output its expected stdout
    (whitespace-normalised); with fn_name each input is an argument list of that function.
    Only the program and the inputs enter the sandbox; outputs are compared here.
    """

    name = "code_tests"
    max_tests = 64

    def prepare(self, expected: Any) -> dict[str, Any]:
        tests = json.loads(expected) if isinstance(expected, str) else expected
        if isinstance(tests, list):  # [{"input": ..., "output": ...}, ...]
            if not all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
                raise ValueError('a list of tests needs {"input": ..., "output": ...} items')
            tests = {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests]}
        if not isinstance(tests, dict) or not isinstance(tests.get("inputs"), list) or not isinstance(tests.get("outputs"), list):
            raise ValueError('tests must be {"inputs": [...], "outputs": [...], "fn_name": optional}')
        if not tests["inputs"] or len(tests["inputs"]) != len(tests["outputs"]):
            raise ValueError(f"tests need as many outputs as inputs (got {len(tests['inputs'])} and {len(tests['outputs'])})")
        fn = tests.get("fn_name") or ""
        if not fn and not all(isinstance(x, str) for x in tests["inputs"] + tests["outputs"]):
            raise ValueError("stdin/stdout tests need string inputs and outputs (or give fn_name)")
        return {"inputs": tests["inputs"][: self.max_tests], "outputs": tests["outputs"][: self.max_tests], "fn_name": fn}

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool:
        from environments.code.harness import normalise, run_harness

        m = _FENCE_RE.match(response.strip())
        code = m.group(1) if m else response
        if not code.strip():
            return False
        fn = expected["fn_name"]
        inputs = [list(x) if isinstance(x, (list, tuple)) else [x] for x in expected["inputs"]] if fn else expected["inputs"]
        run = run_harness(code, "function" if fn else "stdio", inputs, func=fn)
        if run.results is None:
            return False
        for got, want in zip(run.results, expected["outputs"]):
            if "error" in got:
                return False
            if fn:
                if got.get("value") != normalise(want):
                    return False
            elif got.get("stdout", "").split() != str(want).split():
                return False
        return True

    def counterfactuals(self, expected: Any) -> list[str]:
        if expected["fn_name"]:
            return [f"def {expected['fn_name']}(*args):\n    return None\n"]
        return ["print('')\n"]


class FunctionVerifier(Verifier):
    """A user function `module:function`, called as fn(response, expected, row) -> bool or a float in [0, 1]."""

    name = "function"

    def __init__(self, target: str) -> None:
        self.target = target
        self.fn = load_function(target)

    def prepare(self, expected: Any) -> Any:
        return expected  # the user's function decides what it accepts

    def verify(self, response: str, expected: Any, row: dict[str, Any]) -> bool | float:
        return self.fn(response, expected, row)

    def reference(self, expected: Any) -> str | None:
        return str(expected) if isinstance(expected, str) else None


def load_function(target: str) -> Callable[..., Any]:
    """`package.module:function` -> the function; ValueError saying what is wrong."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"verifier {target!r}: a user verifier is written module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"verifier {target!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                         "make the module importable (installed, or on PYTHONPATH) in every process") from None
    if not callable(fn):
        raise ValueError(f"verifier {target!r} is not callable")
    return fn


VERIFIERS: dict[str, type[Verifier]] = {
    v.name: v for v in (MathVerifier, ExactVerifier, RegexVerifier, JsonSchemaVerifier, CodeTestsVerifier)
}


def make_verifier(name: str, whole_completion: bool = False) -> Verifier:
    """The verifier called `name` (one of VERIFIERS, or module:function)."""
    if ":" in name:
        return FunctionVerifier(name)
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}: use one of {sorted(VERIFIERS)} or module:function")
    v = VERIFIERS[name]()
    if isinstance(v, MathVerifier):
        v.strict = not whole_completion
    return v

"""Parse one model turn of a multi-turn environment into a single action.

A turn must hold exactly one action tag (`<bash>...</bash>`, `<answer>...</answer>`,
`<tool>...</tool>`, `<edit path="...">...</edit>` ...). Zero or several actions,
or an unknown tag, is not an action: the environment answers with a format
message and the turn still counts against the budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TAG_RE = re.compile(r"<(?P<tag>[a-z_]+)(?P<attrs>(?:\s+[a-z_]+=\"[^\"]*\")*)\s*>(?P<body>.*?)</(?P=tag)>", re.DOTALL)
_ATTR_RE = re.compile(r"([a-z_]+)=\"([^\"]*)\"")


@dataclass(frozen=True)
class Action:
    """One parsed action: the tag, its attributes and its body (not stripped)."""

    tag: str
    attrs: dict[str, str]
    body: str


def parse_action(turn: str, allowed: tuple[str, ...]) -> Action | None:
    """The single action among `allowed` tags in `turn`, or None if there is not exactly one."""
    found = [m for m in _TAG_RE.finditer(turn) if m.group("tag") in allowed]
    if len(found) != 1:
        return None
    m = found[0]
    return Action(m.group("tag"), dict(_ATTR_RE.findall(m.group("attrs") or "")), m.group("body"))


def format_help(allowed: tuple[str, ...]) -> str:
    tags = ", ".join(f"<{t}>...</{t}>" for t in allowed)
    return f"Format error: write exactly one action per turn, one of {tags}."

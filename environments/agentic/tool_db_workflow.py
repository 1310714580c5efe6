"""tool_db_workflow: JSON tool calls over a generated workplace (tickets, mail, calendar).

The model calls tools as `<tool>{"name": ..., "arguments": {...}}</tool>`, one
per turn, and ends with `<answer>done</answer>`. Tools run in the parent over
plain data (no code from the model is executed; arguments are validated).
The reward compares the final state (tickets, calendar, sent mail) with the
state the generator computed by applying the instructions: every requested
change made, and nothing else. D sets the number of instructions and the
size of the workplace.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from environments.agentic.workplace import SCHEMAS, TOOLS, World, make_world, plan_goals
from environments.base import MultiTurnEnvironment, Score, StepResult, Task, join_turns
from environments.turns import format_help, parse_action

ACTIONS = ("tool", "answer")


def canonical(world: World) -> dict[str, Any]:
    """The comparable final state: created events are compared without their generated ids."""
    events = sorted((e["title"], e["day"], e["hour"], tuple(sorted(e["attendees"]))) for e in world["events"].values())
    sent = sorted((m["to"], m["subject"], m["body"]) for m in world["sent"])
    return {"tickets": world["tickets"], "events": events, "sent": sent}


@dataclass
class _Episode:
    world: World
    turns: int = 0
    finished: bool = False
    done: bool = False
    calls: list[str] = field(default_factory=list)


class ToolDbWorkflow(MultiTurnEnvironment):
    name: ClassVar[str] = "tool_db_workflow"
    domain: ClassVar[str] = "agentic"
    max_turns: ClassVar[int] = 40

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        world = make_world(rng, difficulty)
        n_goals = 1 + difficulty // 2
        goals = plan_goals(rng, world, n_goals)  # [(instruction, [calls]), ...]; applying the calls gives the goal
        final = copy.deepcopy(world)
        calls = [c for _, cs in goals for c in cs]
        for call in calls:
            TOOLS[call["name"]](final, **call["arguments"])
        budget = len(calls) + 4
        steps = "\n".join(f"{i + 1}. {text}" for i, (text, _) in enumerate(goals))
        prompt = (
            "You work in a small company's tools (tickets, mail, calendar). Do the following, exactly and nothing "
            f"more:\n{steps}\n\nTools (JSON Schema of the arguments):\n{json.dumps(SCHEMAS, indent=1)}\n\n"
            'Each turn, call one tool as <tool>{"name": "...", "arguments": {...}}</tool>; you will see its JSON '
            f"result. When everything is done, reply <answer>done</answer>. You have {budget} turns."
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=canonical(final),
            hidden={"world": world, "calls": calls, "turn_budget": budget},
            stats={"instructions": float(n_goals), "tickets": float(len(world["tickets"])),
                   "events": float(len(world["events"])), "calls": float(len(calls))},
        )  # fmt: skip

    def reset(self, task: Task) -> _Episode:
        return _Episode(copy.deepcopy(task.hidden["world"]))

    def step(self, task: Task, state: _Episode, model_turn: str) -> StepResult:
        if state.done:
            return StepResult("The episode is over.", True)
        state.turns += 1
        action = parse_action(model_turn, ACTIONS)
        if action is None:
            obs = format_help(ACTIONS)
        elif action.tag == "answer":
            state.finished = state.done = action.body.strip() == "done"
            obs = "Finished." if state.finished else "Reply <answer>done</answer> to finish."
        else:
            obs = json.dumps(_call_tool(state.world, action.body))
        state.done = state.done or state.turns >= task.hidden["turn_budget"]
        return StepResult(obs, state.done)

    def score_episode(self, task: Task, state: _Episode) -> Score:
        if not state.finished:
            return Score.binary(False, turns=float(state.turns))
        got = canonical(state.world)
        parts = {k: float(got[k] == task.answer[k]) for k in ("tickets", "events", "sent")}
        return Score.binary(all(parts.values()), turns=float(state.turns), **parts)

    def reference_turns(self, task: Task) -> list[str]:
        turns = [f"<tool>{json.dumps(c)}</tool>" for c in task.hidden["calls"]]
        return [*turns, "<answer>done</answer>"]

    def bad_answers(self, task: Task) -> list[str]:
        ref = self.reference_turns(task)
        spam = {"name": "send_mail", "arguments": {"to": task.hidden["world"]["people"][0], "subject": "PASSED", "body": "ok"}}
        return [
            "<answer>done</answer>",  # did nothing
            join_turns(ref[:-2] + ["<answer>done</answer>"]),  # the last change missing
            join_turns(ref[:-1] + [f"<tool>{json.dumps(spam)}</tool>", "<answer>done</answer>"]),  # a side effect too many
            join_turns(ref[:-1]),  # never finishes
        ]

    def worked_response(self, task: Task) -> str:
        state, parts = self.reset(task), []
        for turn in self.reference_turns(task):
            obs = self.step(task, state, turn).observation
            parts.append(turn if turn.startswith("<answer>") else f"{turn}\n<output>{obs}</output>")
        return "\n".join(parts)


def _call_tool(world: World, body: str) -> Any:
    """Run one untrusted tool call; every malformed call becomes an error result, never an exception."""
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return {"error": "the tool call is not valid JSON"}
    if not isinstance(call, dict) or not isinstance(call.get("arguments", {}), dict):
        return {"error": 'expected {"name": ..., "arguments": {...}}'}
    name, args = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or name not in TOOLS:  # {"name": []} is unhashable
        return {"error": f"unknown tool {name!r}; tools: {sorted(TOOLS)}"}
    schema = SCHEMAS[name]["parameters"]
    props = schema["properties"]
    for key, value in args.items():
        if key not in props:
            return {"error": f"unexpected argument {key!r}"}
        if not _type_ok(value, props[key]):
            return {"error": f"argument {key!r} must be {props[key]['type']}"}
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return {"error": f"missing arguments {missing}"}
    return TOOLS[name](world, **args)


def _type_ok(value: Any, prop: dict[str, Any]) -> bool:
    t = prop["type"]
    if t == "string":
        return isinstance(value, str) and len(value) <= 2000 and ("enum" not in prop or value in prop["enum"])
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "array":
        return isinstance(value, list) and len(value) <= 50 and all(isinstance(v, str) for v in value)
    return False

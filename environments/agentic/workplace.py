"""The generated workplace behind tool_db_workflow: data, tools, and instruction plans.

Instructions never interfere: each ticket instruction works inside its own
component (an immutable ticket field) and each calendar instruction on its own
day, so the expected final state does not depend on the order the model
follows.
"""

from __future__ import annotations

import random
from typing import Any, Callable

World = dict[str, Any]

PEOPLE = "ana ben chen dara eli fay gus hana ivan jo kai lea".split()
COMPONENTS = "billing search mobile login export reports api checkout".split()
ISSUES = "crash timeout typo slowness outage regression leak glitch".split()
MEETINGS = "sync review retro planning demo standup".split()


def _str(desc: str, enum: list[str] | None = None) -> dict[str, Any]:
    return {"type": "string", "description": desc, **({"enum": enum} if enum else {})}


STATUS, PRIORITY = ["open", "in_progress", "closed"], ["low", "medium", "high"]
SCHEMAS: dict[str, dict[str, Any]] = {
    "list_tickets": {"description": "Tickets matching every given filter.", "parameters": {"type": "object", "properties": {
        "status": _str("ticket status", STATUS), "assignee": _str("person"), "component": _str("component")}}},
    "update_ticket": {"description": "Change fields of one ticket.", "parameters": {"type": "object", "properties": {
        "id": _str("ticket id"), "status": _str("new status", STATUS), "assignee": _str("new assignee"),
        "priority": _str("new priority", PRIORITY)}, "required": ["id"]}},
    "search_mail": {"description": "Inbox messages whose subject or body contains the query (case-insensitive).",
                    "parameters": {"type": "object", "properties": {"query": _str("text")}, "required": ["query"]}},
    "send_mail": {"description": "Send a message.", "parameters": {"type": "object", "properties": {
        "to": _str("person"), "subject": _str("subject"), "body": _str("body")}, "required": ["to", "subject", "body"]}},
    "list_events": {"description": "Calendar events of one day.", "parameters": {"type": "object", "properties": {
        "day": {"type": "integer", "description": "day 1-7"}}, "required": ["day"]}},
    "create_event": {"description": "Add a one-hour event.", "parameters": {"type": "object", "properties": {
        "title": _str("title"), "day": {"type": "integer", "description": "day 1-7"},
        "hour": {"type": "integer", "description": "start hour 9-16"},
        "attendees": {"type": "array", "items": {"type": "string"}, "description": "people"}},
        "required": ["title", "day", "hour", "attendees"]}},
    "cancel_event": {"description": "Delete one event.", "parameters": {"type": "object", "properties": {
        "id": _str("event id")}, "required": ["id"]}},
}  # fmt: skip


def list_tickets(w: World, status: str | None = None, assignee: str | None = None, component: str | None = None):
    want = {"status": status, "assignee": assignee, "component": component}
    return [t for _, t in sorted(w["tickets"].items()) if all(v is None or t[k] == v for k, v in want.items())]


def update_ticket(w: World, id: str, **fields: str):
    if id not in w["tickets"]:
        return {"error": f"no ticket {id}"}
    if "assignee" in fields and fields["assignee"] not in w["people"]:
        return {"error": f"unknown person {fields['assignee']!r}"}
    w["tickets"][id].update(fields)
    return w["tickets"][id]


def search_mail(w: World, query: str):
    q = query.lower()
    return [m for m in w["inbox"] if q and (q in m["subject"].lower() or q in m["body"].lower())][:20]


def send_mail(w: World, to: str, subject: str, body: str):
    if to not in w["people"]:
        return {"error": f"unknown person {to!r}"}
    w["sent"].append({"to": to, "subject": subject, "body": body})
    return {"sent": True}


def list_events(w: World, day: int):
    return [e for _, e in sorted(w["events"].items()) if e["day"] == day]


def create_event(w: World, title: str, day: int, hour: int, attendees: list[str]):
    if not (1 <= day <= 7 and 9 <= hour <= 16) or any(a not in w["people"] for a in attendees):
        return {"error": "day must be 1-7, hour 9-16, attendees known people"}
    eid = f"E{w['next_event']}"
    w["next_event"] += 1
    w["events"][eid] = {"id": eid, "title": title, "day": day, "hour": hour, "attendees": list(attendees)}
    return w["events"][eid]


def cancel_event(w: World, id: str):
    return {"cancelled": w["events"].pop(id, None) is not None}


TOOLS: dict[str, Callable[..., Any]] = {f.__name__: f for f in
    (list_tickets, update_ticket, search_mail, send_mail, list_events, create_event, cancel_event)}  # fmt: skip


def make_world(rng: random.Random, difficulty: int) -> World:
    people = rng.sample(PEOPLE, min(len(PEOPLE), 4 + difficulty // 2))
    tickets = {}
    for i in range(4 + 2 * difficulty):
        tid = f"T{101 + i}"
        comp = COMPONENTS[i % len(COMPONENTS)] if i < len(COMPONENTS) else rng.choice(COMPONENTS)
        tickets[tid] = {"id": tid, "title": f"{comp} {rng.choice(ISSUES)} #{rng.randint(1, 99)}", "component": comp,
                        "status": rng.choice(STATUS), "assignee": rng.choice(people), "priority": rng.choice(PRIORITY)}  # fmt: skip
    inbox = []
    for i in range(3 + difficulty):
        t = rng.choice(list(tickets.values()))
        inbox.append({"id": f"M{i + 1}", "from": rng.choice(people), "subject": f"About {t['title'].split(' #')[0]}",
                      "body": f"Hi, please look at {t['id']} ({t['title']})."})  # fmt: skip
    events, n = {}, 2 + difficulty
    for i in range(n):
        eid = f"E{i + 1}"
        events[eid] = {"id": eid, "title": f"{rng.choice(MEETINGS)} {rng.choice(COMPONENTS)}", "day": rng.randint(1, 7),
                       "hour": rng.randint(9, 16), "attendees": rng.sample(people, 2)}  # fmt: skip
    return {"people": people, "tickets": tickets, "inbox": inbox, "events": events, "sent": [], "next_event": n + 1}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _ticket_goal(rng: random.Random, w: World, comp: str) -> tuple[str, list[dict]] | None:
    ts = [t for t in w["tickets"].values() if t["component"] == comp]
    kind = rng.choice(["close", "bump", "notify", "reassign"])
    if kind == "close":
        person = rng.choice([t["assignee"] for t in ts])
        hits = [t for t in ts if t["assignee"] == person and t["status"] != "closed"]
        calls = [_call("list_tickets", component=comp, assignee=person)]
        calls += [_call("update_ticket", id=t["id"], status="closed") for t in hits]
        return (f"Close every {comp} ticket assigned to {person} that is not closed yet.", calls) if hits else None
    if kind == "bump":
        hits = [t for t in ts if t["status"] == "open" and t["priority"] != "high"]
        calls = [_call("list_tickets", component=comp, status="open")]
        calls += [_call("update_ticket", id=t["id"], priority="high") for t in hits]
        return (f"Set priority high on every open {comp} ticket.", calls) if hits else None
    if kind == "notify":
        t = rng.choice(ts)
        same = [u for u in ts if u["title"] == t["title"]]
        text = (f"Mail the assignee of the {comp} ticket titled '{t['title']}' with subject 'Update {t['id']}' "
                f"and body 'Status is {t['status']}.'")  # fmt: skip
        calls = [_call("list_tickets", component=comp), _call("send_mail", to=t["assignee"], subject=f"Update {t['id']}", body=f"Status is {t['status']}.")]
        return (text, calls) if len(same) == 1 else None
    mails = [m for m in w["inbox"] if any(t["id"] in m["body"] for t in ts)]
    if not mails:
        return None
    m = rng.choice(mails)
    tid = next(t["id"] for t in ts if t["id"] in m["body"])
    new = rng.choice([p for p in w["people"] if p != w["tickets"][tid]["assignee"]])
    same_subject = [x for x in w["inbox"] if x["from"] == m["from"] and x["subject"] == m["subject"]]
    if len(same_subject) != 1:
        return None
    return (f"{m['from']} sent a mail with subject '{m['subject']}' naming a ticket; assign that ticket to {new}.",
            [_call("search_mail", query=m["subject"]), _call("update_ticket", id=tid, assignee=new)])  # fmt: skip


def _calendar_goal(rng: random.Random, w: World, day: int) -> tuple[str, list[dict]] | None:
    todays = [e for e in w["events"].values() if e["day"] == day]
    if rng.random() < 0.5 and todays:
        word = rng.choice(todays)["title"].split()[0]
        hits = [e for e in todays if word in e["title"]]
        calls = [_call("list_events", day=day)] + [_call("cancel_event", id=e["id"]) for e in hits]
        return f"Cancel every event on day {day} whose title contains '{word}'.", calls
    a, b = rng.sample(w["people"], 2)
    busy = {e["hour"] for e in todays if a in e["attendees"] or b in e["attendees"]}
    hour = next((h for h in range(9, 17) if h not in busy), None)
    if hour is None:
        return None
    title = f"{rng.choice(MEETINGS)} with {a} and {b}"
    text = (f"Schedule '{title}' on day {day} for {a} and {b} at the earliest whole hour from 9 to 16 when neither "
            "of them has an event that day.")  # fmt: skip
    return text, [_call("list_events", day=day), _call("create_event", title=title, day=day, hour=hour, attendees=[a, b])]


def plan_goals(rng: random.Random, w: World, n_goals: int) -> list[tuple[str, list[dict]]]:
    """n_goals independent instructions with the calls that carry them out."""
    comps = [c for c in COMPONENTS if any(t["component"] == c for t in w["tickets"].values())]
    rng.shuffle(comps)
    days = rng.sample(range(1, 8), 7)
    goals: list[tuple[str, list[dict]]] = []
    for _ in range(200):
        if len(goals) == n_goals:
            break
        use_ticket = comps and (not days or rng.random() < 0.6)
        goal = _ticket_goal(rng, w, comps[-1]) if use_ticket else _calendar_goal(rng, w, days[-1])
        if goal is not None and goal[1]:
            goals.append(goal)
            (comps if use_ticket else days).pop()
    if len(goals) < n_goals:
        raise RuntimeError("could not plan enough independent instructions")
    return goals

"""Checks `gpumigrate evacuate --events` output against its schema
(include/gpumigrate/evacuation/evacuation_events.h, version 1): every line a JSON object
with the common fields, seq 1, 2, ... in order, each type's fields with their
types, a plan first and done last, and each VM's events in an order that makes
sense (started before its outcome; a hook started before it ended)."""
import json

COMMON = {"v": int, "seq": int, "time_unix_ms": int, "evacuation": str, "host": str, "event": str}
TYPES = {
    "plan": {"feasible": bool, "predicted_ms": int, "why": str, "actions": list},
    "refused": {"reason": str},
    "action-started": {"vm": str, "action": str, "target": str, "predicted_stun_ms": int},
    "phase": {"vm": str, "phase": str, "round": int},
    "paced": {"vm": str, "bytes_per_s": int},
    "hook": {"vm": str, "hook": str, "on": str, "state": str},
    "outcome": {"vm": str, "action": str, "target": str, "outcome": str, "detail": str,
                "predicted_stun_ms": int, "measured_stun_ms": (int, float)},
    "done": {"exit": int, "outcomes": dict},
}


def validate(text):
    """Returns (events, problems): the parsed events and what is wrong with them."""
    events, problems = [], []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            e = json.loads(line)
        except ValueError as err:
            problems.append(f"line {n}: not JSON: {err}: {line[:200]}")
            continue
        if not isinstance(e, dict):
            problems.append(f"line {n}: not an object")
            continue
        fields = dict(COMMON, **TYPES.get(e.get("event"), {}))
        if e.get("event") not in TYPES:
            problems.append(f"line {n}: unknown event {e.get('event')!r}")
        for key, kind in fields.items():
            if key not in e or isinstance(e[key], bool) != (kind is bool) or not isinstance(e[key], kind):
                problems.append(f"line {n}: {e.get('event')}: {key!r} missing or not {kind}: {line[:300]}")
        if e.get("v") != 1:
            problems.append(f"line {n}: v is {e.get('v')!r}, not 1")
        if e.get("seq") != len(events) + 1:
            problems.append(f"line {n}: seq {e.get('seq')} after {len(events)} events")
        if events and e.get("time_unix_ms", 0) < events[-1].get("time_unix_ms", 0):
            problems.append(f"line {n}: time goes back")
        events.append(e)
    if not events:
        return events, ["no events"]
    if events[0]["event"] not in ("plan", "refused"):
        problems.append(f"the first event is {events[0]['event']}, not plan (or refused)")
    if events[-1]["event"] != "done":
        problems.append(f"the last event is {events[-1]['event']}, not done")
    started, open_hooks = set(), set()
    for e in events:
        vm = e.get("vm")
        if e["event"] == "action-started":
            started.add(vm)
        elif e["event"] in ("phase", "paced") and vm not in started:
            problems.append(f"{vm}: {e['event']} before action-started")
        elif e["event"] == "hook":
            key = (vm, e["hook"])
            if e["state"] == "started":
                open_hooks.add(key)
            elif key not in open_hooks:
                problems.append(f"{vm}: hook {e['hook']} {e['state']} before it started")
            else:
                open_hooks.discard(key)
        elif e["event"] == "outcome" and e["outcome"] == "completed" and vm not in started:
            problems.append(f"{vm}: completed without action-started")
    return events, problems

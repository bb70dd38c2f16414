#!/usr/bin/env python3
"""The Grafana dashboard scripts/grafana/gpumigrate.json against the series the
agent exports (issue 43's metrics).

Checks, each printed as an `ok: ...` or `FAIL: ...` line:
- the dashboard parses as JSON and is importable as is: uid `gpumigrate`, its
  title, a schemaVersion, no `__inputs`, a `datasource` template variable
  (type datasource, query prometheus) and a multi-value, include-All `host`
  variable over `label_values(gpumigrate_host_vms, host)`;
- the families the agent exports, read from engine/agent/metrics.cc (every
  call such as `p.Family("gpumigrate_...", "gauge", ...)`, also through the
  file's helpers that pass a literal name and type on to p.Family), are the
  families of README's metrics table ("### Metrics: what Prometheus scrapes
  from every agent"), both ways, and the labels that table names are known;
- every panel, rows' nested panels included, has a unique id, a title, a
  description and a gridPos inside the 24-column grid; every panel but a row
  has at least one target with an expr, and uses the `$datasource` variable;
- every expr (and the host variable's query) names at least one gpumigrate_
  metric, and every one it names is an exported family; every selector of one
  filters `host=~"$host"`; every label in a `{...}` selector, a `by (...)`,
  `without`, `on`, `ignoring` or `group_left/right` clause, and every
  `{{label}}` of a legend is a documented label (host, vm, direction, phase,
  outcome, gpu, mode, hook) or Prometheus' own (instance, job, le);
  rate/irate/increase apply to counters only; brackets balance;
- every exported family appears on the dashboard.

Exit 1 on any failure, 0 otherwise. Needs nothing beyond python3.

Usage: grafana_dashboard_test.py [DASHBOARD.json]   (run from anywhere; the
repository is found from this file's path; DASHBOARD defaults to
scripts/grafana/gpumigrate.json)
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DASHBOARD = os.path.join(ROOT, "scripts", "grafana", "gpumigrate.json")
METRICS_CC = os.path.join(ROOT, "engine", "agent", "metrics.cc")
README = os.path.join(ROOT, "docs/evacuation.md")
README_HEADING = "### Metrics: what Prometheus scrapes from every agent"

# The labels README documents for the agent's series, and Prometheus' own.
DOCUMENTED_LABELS = {"host", "vm", "direction", "phase", "outcome", "gpu", "mode", "hook"}
PROMETHEUS_LABELS = {"instance", "job", "le"}
ALLOWED_LABELS = DOCUMENTED_LABELS | PROMETHEUS_LABELS
HOST_FILTER = 'host=~"$host"'

METRIC_RE = re.compile(r"\bgpumigrate_[a-z0-9_]+")
# A literal family name and type passed to p.Family, or to a helper of the file
# that passes them on to it (per_running("name", "gauge", ...)).
FAMILY_RE = re.compile(r'\b(\w+(?:\.\w+)?)\(\s*"(gpumigrate_[a-z0-9_]+)"\s*,\s*"(gauge|counter|histogram|summary|untyped)"')
LABEL_MATCHER_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")
GROUPING_RE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
LEGEND_LABEL_RE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
COUNTER_FUNC_RE = re.compile(r"\b(rate|irate|increase)\s*\(\s*(gpumigrate_[a-z0-9_]+)")

failures = 0


def check(what, ok, detail=""):
    global failures
    if ok:
        print(f"ok: {what}", flush=True)
    else:
        failures += 1
        print(f"FAIL: {what}" + (f": {detail}" if detail else ""), flush=True)
    return ok


# --- the exported families -------------------------------------------------

def exported_families(source_text):
    """{name: type} of every family metrics.cc declares with a literal name."""
    families = {}
    for m in FAMILY_RE.finditer(source_text):
        families[m.group(2)] = m.group(3)
    return families


def readme_metrics_section(readme_text):
    start = readme_text.find(README_HEADING)
    if start < 0:
        return None
    rest = readme_text[start + len(README_HEADING):]
    end = re.search(r"^#{1,3} ", rest, re.M)
    return rest[: end.start()] if end else rest


def readme_families(section):
    """The families the section's table names, and the labels it gives in {...}."""
    names, labels = set(), set()
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = line.split("|")
        if len(cells) < 3:
            continue
        first = cells[1]
        names.update(re.findall(r"`(gpumigrate_[a-z0-9_]+)(?:\{[^}`]*\})?`", first))
        for group in re.findall(r"`gpumigrate_[a-z0-9_]+\{([^}`]*)\}`", first):
            labels.update(l.strip() for l in group.split(",") if l.strip())
    return names, labels


# --- the dashboard ---------------------------------------------------------

def all_panels(panels):
    """Every panel, depth first, rows' nested panels included."""
    out = []
    for p in panels or []:
        if not isinstance(p, dict):
            continue
        out.append(p)
        out.extend(all_panels(p.get("panels")))
        out.extend(all_panels(p.get("rows")))
    return out


def strip_strings(expr):
    """The expr with every quoted string's content blanked (label values,
    regexes), its length and the offsets in it kept."""
    out, i, n = list(expr), 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                step = 2 if expr[j] == "\\" and c != "`" else 1
                for k in range(j, min(j + step, n)):
                    out[k] = " "
                j += step
            i = j + 1
        else:
            i += 1
    return "".join(out)


def selector_after(expr, end):
    """The text inside the {...} that follows position end of expr, or None."""
    i = end
    while i < len(expr) and expr[i].isspace():
        i += 1
    if i >= len(expr) or expr[i] != "{":
        return None
    j, quote = i + 1, None
    while j < len(expr):
        c = expr[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c == "}":
            return expr[i + 1 : j]
        j += 1
    return None


def balanced(expr):
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for c in strip_strings(expr):
        if c in "([{":
            stack.append(c)
        elif c in ")]}":
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def expr_problems(expr, families, require_host_filter=True):
    """What is wrong with one PromQL expr; [] when nothing is."""
    problems = []
    bare = strip_strings(expr)
    names = METRIC_RE.findall(bare)
    if not names:
        problems.append("names no gpumigrate_ metric")
    for name in sorted(set(names)):
        if name not in families:
            problems.append(f"{name} is no family the agent exports")
    if require_host_filter:
        for m in METRIC_RE.finditer(bare):
            sel = selector_after(expr, m.end())  # strip_strings keeps the offsets
            if sel is None or HOST_FILTER not in sel.replace(" ", ""):
                problems.append(f"{m.group(0)} is not filtered by {HOST_FILTER}")
    labels = set()
    for sel in re.findall(r"\{([^{}]*)\}", bare):
        labels.update(m.group(1) for m in LABEL_MATCHER_RE.finditer(sel))
    for m in GROUPING_RE.finditer(bare):
        labels.update(l.strip() for l in m.group(2).split(",") if l.strip())
    for label in sorted(labels - ALLOWED_LABELS):
        problems.append(f"label {label} is not documented")
    for m in COUNTER_FUNC_RE.finditer(bare):
        kind = families.get(m.group(2))
        if kind is not None and kind != "counter":
            problems.append(f"{m.group(1)}() over {m.group(2)}, a {kind}")
    if not balanced(expr):
        problems.append("brackets do not balance")
    return problems


def uses_datasource_variable(panel):
    refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets") or []]
    for r in refs:
        uid = r.get("uid") if isinstance(r, dict) else r
        if uid in ("${datasource}", "$datasource"):
            return True
    return False


def check_dashboard(dash, families):
    """Run the dashboard's checks; returns (panels, exprs) for the summary."""
    check("dashboard is a JSON object", isinstance(dash, dict))
    if not isinstance(dash, dict):
        return [], []
    check('uid is "gpumigrate"', dash.get("uid") == "gpumigrate", repr(dash.get("uid")))
    check("title", dash.get("title") == "gpumigrate: migrations and evacuations", repr(dash.get("title")))
    check("schemaVersion is a number >= 30", isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 30,
          repr(dash.get("schemaVersion")))
    check("no __inputs (imports as is)", "__inputs" not in dash)

    variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list") or [] if isinstance(v, dict)}
    ds = variables.get("datasource") or {}
    check("template variable datasource: type datasource, query prometheus",
          ds.get("type") == "datasource" and ds.get("query") == "prometheus", repr(ds) if ds else "missing")
    host = variables.get("host") or {}
    q = host.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    check("template variable host: label_values(gpumigrate_host_vms, host), multi, includeAll",
          q == "label_values(gpumigrate_host_vms, host)" and host.get("multi") is True and host.get("includeAll") is True,
          repr(host) if host else "missing")
    if isinstance(q, str):
        names = METRIC_RE.findall(q)
        bad = sorted(n for n in set(names) if n not in families)
        check("host variable's query names exported metrics", names and not bad,
              ", ".join(bad) or "no gpumigrate_ metric")

    panels = all_panels(dash.get("panels"))
    panels += [p for row in dash.get("rows") or [] if isinstance(row, dict) for p in all_panels(row.get("panels"))]
    check("dashboard has panels", bool(panels))
    ids = [p.get("id") for p in panels]
    dup = sorted({i for i in ids if ids.count(i) > 1}, key=repr)
    check(f"panel ids unique ({len(ids)} panels)", all(isinstance(i, int) for i in ids) and not dup,
          f"duplicated {dup}" if dup else f"not integers: {[i for i in ids if not isinstance(i, int)]}")

    exprs, used = [], set()
    for p in panels:
        name = f"panel {p.get('id')} {p.get('title')!r}"
        wrong = []
        if not (isinstance(p.get("title"), str) and p["title"].strip()):
            wrong.append("no title")
        g = p.get("gridPos") or {}
        if not (all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")) and g["w"] >= 1 and g["h"] >= 1
                and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24):
            wrong.append(f"gridPos {g!r} not inside the 24-column grid")
        targets = [t for t in p.get("targets") or [] if isinstance(t, dict)]
        if p.get("type") == "row":
            check(f"{name} (row): title, gridPos", not wrong, "; ".join(wrong))
            continue
        if not (isinstance(p.get("description"), str) and p["description"].strip()):
            wrong.append("no description")
        if not targets:
            wrong.append("no target")
        if not uses_datasource_variable(p):
            wrong.append(f"datasource {p.get('datasource')!r} is not the $datasource variable")
        check(f"{name} ({p.get('type')}): title, description, gridPos, {len(targets)} target(s), $datasource",
              not wrong, "; ".join(wrong))
        for t in targets:
            expr = t.get("expr")
            what = f"{name} target {t.get('refId')}"
            if not isinstance(expr, str) or not expr.strip():
                check(f"{what}: has an expr", False, repr(expr))
                continue
            exprs.append(expr)
            used.update(n for n in METRIC_RE.findall(strip_strings(expr)) if n in families)
            problems = expr_problems(expr, families)
            legend = t.get("legendFormat") or ""
            for label in sorted(set(LEGEND_LABEL_RE.findall(legend)) - ALLOWED_LABELS):
                problems.append(f"legend label {label} is not documented")
            check(f"{what}: {expr}", not problems, "; ".join(problems))
    if families:
        unused = sorted(set(families) - used)
        check(f"every exported family is on the dashboard ({len(used)} of {len(families)})", not unused,
              ", ".join(unused))
    return panels, exprs


def load_families():
    """The families metrics.cc exports, cross-checked with README's table."""
    try:
        source = open(METRICS_CC, encoding="utf-8").read()
    except OSError as e:
        check(f"read {METRICS_CC}", False, str(e))
        return {}
    families = exported_families(source)
    check(f"engine/agent/metrics.cc exports families ({len(families)})", bool(families))
    literal_calls = len(re.findall(r'\bp\.Family\(\s*"', source))
    check("every p.Family(\"...\") call found", literal_calls <= len(families),
          f"{literal_calls} literal calls, {len(families)} families parsed")
    try:
        readme = open(README, encoding="utf-8").read()
    except OSError as e:
        check(f"read {README}", False, str(e))
        return families
    section = readme_metrics_section(readme)
    if not check(f"README has section {README_HEADING!r}", section is not None):
        return families
    documented, table_labels = readme_families(section)
    missing = sorted(set(families) - documented)
    check("every exported family is in README's metrics table", not missing, ", ".join(missing))
    extra = sorted(documented - set(families))
    check("every family of README's metrics table is exported", not extra, ", ".join(extra))
    unknown = sorted(table_labels - DOCUMENTED_LABELS)
    check(f"README's table labels are the documented ones ({', '.join(sorted(table_labels))})", not unknown,
          ", ".join(unknown))
    return families


def main(argv):
    path = os.path.abspath(argv[1]) if len(argv) > 1 else DASHBOARD
    families = load_families()
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        check(f"{path} parses as JSON", False, str(e))
        print(f"{failures} failed", flush=True)
        return 1
    check(f"{os.path.relpath(path, ROOT)} parses as JSON", True)
    panels, exprs = check_dashboard(dash, families)
    print(f"{'FAIL' if failures else 'ok'}: {len(panels)} panels "
          f"({sum(1 for p in panels if p.get('type') != 'row')} with queries), {len(exprs)} queries, "
          f"{len(families)} exported families; {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

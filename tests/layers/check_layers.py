#!/usr/bin/env python3
"""Checks that the library's layers only depend downwards (docs/design.md "Layers and
folders"), by what each layer's code includes and by the symbols its archive
uses. The allowed arrows are the CMake link lines (layers.txt, written by the
build: one line per layer, "name<TAB>archive<TAB>folders<TAB>deps", lists
separated by ',').

  check_layers.py LAYERS_TXT SOURCE_DIR
"""
import re
import subprocess
import sys
from pathlib import Path

# Which layer each public header belongs to: the one that defines it (or, for a
# seam's interface, the lowest layer that uses it). None: no layer may include it.
PUBLIC_HEADERS = {
    "status.h": "common", "units.h": "common", "launcher.h": "common", "clock.h": "common", "bitmap.h": "common",
    "stats.h": "common", "rate_file.h": "common", "prom_text.h": "common",
    "stream.h": "common",  # the Stream interface; MakePipe, its in-memory pipe, is net's
    "codec.h": "codec",
    "switchover.h": "policy",
    "outcome.h": "devices",
    "device.h": "devices", "open_device.h": "devices", "dirty_tracker.h": "devices", "sim.h": "devices", "proc.h": "devices", "cuda.h": "devices", "vfio.h": "devices", "shm.h": "devices",
    "iommu_tracking.h": "devices", "cuda_checkpoint.h": "devices",
    "session.h": "session", "report.h": "session", "local_migration.h": "session",
    "estimator.h": "estimator", "calibration.h": "estimator", "path_calibration.h": "estimator", "path_spread.h": "estimator", "projection.h": "estimator",
    "checkpoint.h": "checkpoint",
    "metrics_server.h": "net",
    "planner.h": "planner",
    "evacuation.h": "evacuation", "evacuation_store.h": "evacuation", "evacuation_events.h": "evacuation",
    "content_store.h": "content",
    "agent.h": "agent",
    "qmp.h": "qemu", "qemu.h": "qemu",
    "shim.h": None,  # libgpumigrate_shim's C API, for workloads
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    layers_txt, src = Path(sys.argv[1]), Path(sys.argv[2])
    layers = {}
    for line in layers_txt.read_text().splitlines():
        if not line.strip():
            continue
        name, archive, folders, deps = line.split("\t")
        short = name.removeprefix("gpumigrate_")
        layers[short] = {
            "archive": archive,
            "folders": [f for f in folders.split(",") if f],
            "deps": {d.removeprefix("gpumigrate_") for d in deps.split(",") if d},
        }

    def below(name, seen=None):  # every layer reachable over the arrows
        seen = set() if seen is None else seen
        for d in layers.get(name, {}).get("deps", ()):
            if d not in seen:
                seen.add(d)
                below(d, seen)
        return seen

    def owner_of_path(rel):
        for name, l in layers.items():
            if any(rel == f or rel.startswith(f + "/") for f in l["folders"]):
                return name
        return None

    errors = []

    def check_include(name, where, inc):
        if inc.startswith("gpumigrate/"):
            header = inc.removeprefix("gpumigrate/")
            if header not in PUBLIC_HEADERS:
                errors.append(f"{where}: {inc} is not in check_layers.py's PUBLIC_HEADERS; say which layer owns it")
                return
            target = PUBLIC_HEADERS[header]
            if target is None:
                errors.append(f"{where}: includes {inc}, which no layer may include")
                return
        else:
            target = owner_of_path(inc)
        if target and target != name and target not in below(name):
            errors.append(f"{where}: {name} includes {inc} of layer {target}, which it does not link")

    for name, l in layers.items():
        for folder in l["folders"]:
            for f in sorted((src / folder).rglob("*")):
                if f.suffix in (".cc", ".h"):
                    for inc in INCLUDE.findall(f.read_text()):
                        check_include(name, f.relative_to(src), inc)
    for f in sorted((src / "include/gpumigrate").glob("*.h")):
        name = PUBLIC_HEADERS.get(f.name)
        if name:
            for inc in INCLUDE.findall(f.read_text()):
                check_include(name, f.relative_to(src), inc)

    # Symbols: what each archive leaves undefined and another layer defines.
    def nm(*args):
        out = subprocess.run(["nm", "-C", *args], check=True, capture_output=True, text=True).stdout
        return out.splitlines()

    defined = {}
    for name, l in layers.items():
        for line in nm("--defined-only", "-g", l["archive"]):
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "TDBR":  # strong definitions only
                defined.setdefault(parts[2], set()).add(name)
    for name, l in layers.items():
        allowed = below(name) | {name}
        for line in nm("-u", l["archive"]):
            line = line.strip()
            if not line.startswith("U "):
                continue
            sym = line[2:]
            for owner in defined.get(sym, ()):
                if owner not in allowed:
                    errors.append(f"{name} uses {sym} of layer {owner}, which it does not link")

    for e in sorted(set(errors)):
        print(e)
    if errors:
        print(f"{len(set(errors))} upward dependencies", file=sys.stderr)
        return 1
    print(f"{len(layers)} layers, dependencies point down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

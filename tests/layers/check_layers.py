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

# A public header's layer is its folder (include/gpumigrate/<layer>/X.h): the
# layer that defines it (or, for a seam's interface, the lowest layer that uses
# it; stream.h's Stream is common's, MakePipe, its in-memory pipe, is net's).
# include/gpumigrate/shim.h is libgpumigrate_shim's C API, for workloads: no
# layer may include it.
UNLAYERED = {"shim.h"}
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
            parts = inc.split("/")
            if len(parts) == 2 and parts[1] in UNLAYERED:
                errors.append(f"{where}: includes {inc}, which no layer may include")
                return
            if len(parts) != 3 or parts[1] not in layers:
                errors.append(f"{where}: {inc} is not in a layer's folder (include/gpumigrate/<layer>/)")
                return
            target = parts[1]
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
    for f in sorted((src / "include/gpumigrate").rglob("*.h")):
        rel = f.relative_to(src / "include/gpumigrate")
        if len(rel.parts) == 1:
            if rel.name not in UNLAYERED:
                errors.append(f"{f.relative_to(src)}: a public header belongs in its layer's folder")
            continue
        if len(rel.parts) != 2 or rel.parts[0] not in layers:
            errors.append(f"{f.relative_to(src)}: include/gpumigrate/{rel.parts[0]}/ is no layer")
            continue
        for inc in INCLUDE.findall(f.read_text()):
            check_include(rel.parts[0], f.relative_to(src), inc)

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

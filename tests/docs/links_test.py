#!/usr/bin/env python3
"""Checks the project's documents hold together (issue 41).

(a) Every relative link `[text](path)` or `[text](path#anchor)` in README.md and
    docs/*.md names a file in the repository, and an anchor names a heading of
    the target file (GitHub's slugs). http(s) and mailto links are skipped, and
    so is anything inside code.
(b) Every `*.md` file the code names (.cc .h .py .sh .txt .proto files and
    CMakeLists.txt, outside build/) exists, relative to the repository root or
    to the file that names it: a comment citing "docs/planner.md" must lead a
    reader somewhere.
(c) README.md is a front door of at most 400 lines; the rest lives in docs/.

Usage: links_test.py [REPO_ROOT]   (default: the repository holding this file)
Prints one "ok:" or "FAIL:" line per check; exits 0 when all pass, 1 otherwise.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
README_MAX_LINES = 400
CODE_EXTS = (".cc", ".h", ".py", ".sh", ".txt", ".proto")
SKIP_DIRS = {"build", ".git", ".gpu-stage", "node_modules"}

failures = 0


def check(name, ok, detail=""):
    global failures
    if ok:
        print(f"ok: {name}")
    else:
        failures += 1
        print(f"FAIL: {name}" + (f": {detail}" if detail else ""))
    return ok


def strip_code(text):
    """The text with fenced blocks and inline code spans blanked out (line count kept)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            out.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
            continue
        out.append(re.sub(r"`+[^`]*`+", "code", line))
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a markdown file (duplicates numbered as GitHub does)."""
    seen, result = {}, set()
    fence = False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        result.add(s if n == 0 else f"{s}-{n}")
    return result


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return [f for f in files if os.path.isfile(f)]


def check_links():
    link = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
    for md in markdown_files():
        rel_md = os.path.relpath(md, ROOT)
        text = strip_code(open(md, encoding="utf-8").read())
        bad, count = [], 0
        for lineno, line in enumerate(text.split("\n"), 1):
            for target in link.findall(line):
                if re.match(r"^(https?:|mailto:)", target):
                    continue
                count += 1
                path, _, anchor = target.partition("#")
                dest = md if path == "" else os.path.normpath(os.path.join(os.path.dirname(md), path))
                if not os.path.exists(dest):
                    bad.append(f"{rel_md}:{lineno}: {target}: no such file")
                    continue
                if not os.path.realpath(dest).startswith(os.path.realpath(ROOT) + os.sep):
                    bad.append(f"{rel_md}:{lineno}: {target}: outside the repository")
                    continue
                if anchor:
                    if not dest.endswith(".md") or os.path.isdir(dest):
                        bad.append(f"{rel_md}:{lineno}: {target}: an anchor into a file that is not markdown")
                    elif anchor not in anchors(dest):
                        bad.append(f"{rel_md}:{lineno}: {target}: no heading with that anchor in "
                                   f"{os.path.relpath(dest, ROOT)}")
        check(f"{rel_md}: its {count} relative links resolve", not bad, "; ".join(bad))


def code_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames if not (rel == "." and d in SKIP_DIRS) and not d.startswith(".")]
        for f in filenames:
            if f.endswith(CODE_EXTS) or f == "CMakeLists.txt":
                yield os.path.join(dirpath, f)


def check_named_documents():
    name = re.compile(r"(?<![\w./-])((?:\.{0,2}/)?[\w./-]*[\w-]\.md)\b")
    bad, seen = [], 0
    for path in code_files():
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError as e:
            bad.append(f"{path}: {e}")
            continue
        for lineno, line in enumerate(text.split("\n"), 1):
            for doc in name.findall(line):
                seen += 1
                candidates = [os.path.join(ROOT, doc), os.path.join(os.path.dirname(path), doc)]
                if not any(os.path.isfile(c) for c in candidates):
                    bad.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {doc}")
    check(f"every .md file the code names exists ({seen} mentions)", not bad, "; ".join(bad))


def check_readme_length():
    readme = os.path.join(ROOT, "README.md")
    if not check("README.md exists", os.path.isfile(readme)):
        return
    lines = open(readme, encoding="utf-8").read().count("\n")
    check(f"README.md is at most {README_MAX_LINES} lines ({lines})", lines <= README_MAX_LINES)


def main():
    check_links()
    check_named_documents()
    check_readme_length()
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

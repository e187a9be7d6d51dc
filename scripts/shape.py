#!/usr/bin/env python3
"""The shape the protocol's code keeps (docs/development.md): no function
over 80 lines anywhere in server/, no file of the agent's session or the
server's bridge over 600 lines. Prints what breaks it and exits 1."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FN = 80
MAX_FILE = 600
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?((async|const|unsafe|extern \"C\")\s+)*fn\s+(\w+)")


def code_only(line, in_block):
    """The line without comments, strings and char literals, and whether a
    block comment is still open after it."""
    out, i = [], 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_block = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            i, in_block = i + 2, True
        elif line[i] == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
        elif line[i] == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.[^']*|[^\\'])'", line[i:]).group(0))
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_block


def long_functions(path):
    lines = path.read_text().splitlines()
    found, in_block = [], False
    cleaned = []
    for line in lines:
        code, in_block = code_only(line, in_block)
        cleaned.append(code)
    for start, line in enumerate(cleaned):
        m = FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for end in range(start, len(cleaned)):
            for ch in cleaned[end]:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if not opened and ";" in cleaned[end]:
                break  # a declaration without a body
            if opened and depth == 0:
                length = end - start + 1
                if length > MAX_FN:
                    found.append((start + 1, m.group(5), length))
                break
    return found


def main():
    broken = []
    for path in sorted((ROOT / "server").rglob("*.rs")):
        for line, name, length in long_functions(path):
            broken.append(f"{path.relative_to(ROOT)}:{line}: fn {name} is {length} lines (at most {MAX_FN})")
    sessions = [ROOT / "agent/src/session.rs", *sorted((ROOT / "agent/src/session").rglob("*.rs"))]
    bridges = [ROOT / "server/src/bridge.rs", *sorted((ROOT / "server/src/bridge").rglob("*.rs"))]
    for path in sessions + bridges:
        n = len(path.read_text().splitlines())
        if n > MAX_FILE:
            broken.append(f"{path.relative_to(ROOT)}: {n} lines (at most {MAX_FILE})")
    for b in broken:
        print(b)
    if broken:
        sys.exit(1)
    print(f"shape: no server function over {MAX_FN} lines, no session or bridge file over {MAX_FILE}")


if __name__ == "__main__":
    main()

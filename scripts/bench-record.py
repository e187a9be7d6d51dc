#!/usr/bin/env python3
"""Records bench figures in the table of current figures.

BENCHMARKS.md and RELIABILITY.md open with a table of every current figure
(name, value, unit, the command that measures it, commit, date, load
average) and a block holding exactly one `BENCH <name> <value> <unit>` line
per figure. Both are written by this script, from bench output, never by
hand; the story of each measurement goes below them (and, for older runs,
to docs/benchmarks-history.md).

    <bench command> 2>&1 | scripts/bench-record.py --command '<bench command>'
    scripts/bench-record.py --check BENCHMARKS.md RELIABILITY.md

Recording passes the output through, takes every `BENCH` line from it,
and replaces (or adds) those figures' rows. The load average is the one
the bench printed ("load average at start: X", "load average before X"),
else the machine's now. The commit is HEAD's, marked `+changes` when the
work tree differs from it (`--commit` and `--date` record output saved
from an earlier run).
"""

import argparse
import datetime
import os
import re
import subprocess
import sys

BEGIN = "<!-- figures: written by scripts/bench-record.py; do not edit by hand -->"
END = "<!-- end of figures -->"
HEADER = "| figure | value | unit | command | commit | date | load average |"
RULE = "|---|---|---|---|---|---|---|"
BENCH = re.compile(r"^\s*BENCH\s+(\S+)\s+(\S+)\s*(.*?)\s*$")
LOAD = re.compile(r"load average (?:at start:?|before)\s*([0-9.]+)")


class Table:
    """The figures of one file, by name."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        if BEGIN not in self.text or END not in self.text:
            sys.exit(f"{path}: no table of figures (the markers {BEGIN!r} and {END!r})")
        self.head, rest = self.text.split(BEGIN, 1)
        self.block, self.tail = rest.split(END, 1)
        self.rows = {}
        self.lines = {}
        for line in self.block.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and len(cells) == 7 and cells[0] != "figure":
                self.rows[cells[0].strip("`")] = cells
            m = BENCH.match(line)
            if m:
                if m.group(1) in self.lines:
                    sys.exit(f"{path}: two BENCH lines for {m.group(1)}")
                self.lines[m.group(1)] = (m.group(2), m.group(3))

    def check(self):
        """The table and the BENCH block say the same, one line per figure."""
        problems = []
        for name, (value, unit) in self.lines.items():
            row = self.rows.get(name)
            if row is None:
                problems.append(f"{name}: a BENCH line but no row")
            elif (row[1], row[2]) != (value, unit):
                problems.append(f"{name}: the row says {row[1]} {row[2]}, the BENCH line {value} {unit}")
        for name in self.rows:
            if name not in self.lines:
                problems.append(f"{name}: a row but no BENCH line")
        body = self.head + self.tail
        for line in body.splitlines():
            m = BENCH.match(line)
            if m and line.startswith("BENCH"):
                problems.append(f"{m.group(1)}: a BENCH line outside the table's block")
        return problems

    def record(self, name, value, unit, command, commit, date, load):
        self.rows[name] = [name, value, unit, f"`{command}`", commit, date, load]
        self.lines[name] = (value, unit)

    def write(self):
        out = [BEGIN, "", HEADER, RULE]
        for name in sorted(self.rows):
            row = self.rows[name]
            out.append("| " + " | ".join([f"`{name}`"] + row[1:]) + " |")
        out += ["", "```"]
        for name in sorted(self.lines):
            value, unit = self.lines[name]
            out.append(f"BENCH {name} {value} {unit}".rstrip())
        out += ["```", ""]
        text = self.head + "\n".join(out) + END + self.tail
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(text)


def commit():
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+changes" if changed else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", help="the command that printed the output on stdin")
    parser.add_argument("--file", default="BENCHMARKS.md", help="the file whose table to update")
    parser.add_argument("--commit", help="the commit the output was measured on (default: HEAD now)")
    parser.add_argument("--date", help="the day it was measured, YYYY-MM-DD (default: today, UTC)")
    parser.add_argument("--check", nargs="*", metavar="FILE", help="check these files' tables; record nothing")
    args = parser.parse_args()
    if args.check is not None:
        problems = []
        for path in args.check or ["BENCHMARKS.md", "RELIABILITY.md"]:
            problems += [f"{path}: {p}" for p in Table(path).check()]
        for p in problems:
            print(p, file=sys.stderr)
        sys.exit(1 if problems else 0)
    if not args.command:
        parser.error("--command is required to record (say what printed the figures)")
    table = Table(args.file)
    figures, load = [], None
    for line in sys.stdin:
        sys.stdout.write(line)
        m = BENCH.match(line)
        if m:
            figures.append((m.group(1), m.group(2), m.group(3)))
        found = LOAD.search(line)
        if found and load is None:
            load = found.group(1)
    if load is None:
        load = os.getloadavg()[0].__format__(".2f")
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    at = args.commit or commit()
    for name, value, unit in figures:
        table.record(name, value, unit, args.command, at, date, load)
    if figures:
        table.write()
    print(f"recorded {len(figures)} figures in {args.file}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One mutation run as one compact record, and what a record says.

  mutants-record.py write RUN_DIR RECORD.md [--title T] [--notes NOTES.md ...]
      RUN_DIR is what scripts/mutants.sh leaves for a run (one folder per file mutated, with
      cargo-mutants' caught.txt / missed.txt / unviable.txt / timeout.txt, the tests that
      ran, the seconds it took; optionally outcomes.json for the run's times). RECORD.md gets
      the run's summary table and, per file, one line per mutant: its outcome and where and
      what was changed. NOTES (prose, e.g. why the missed mutants are equivalent) are appended.
      The counts are checked against the lists before anything is written.

  mutants-record.py names RECORD.md [OUTCOME ...]
      Prints the full names (`file:line:column: what was changed`, as cargo-mutants names
      them) of the record's mutants with those outcomes (default: missed), one a line: what
      MUTANTS_ONLY takes.

A record's mutant lines sit in a fenced block under `## <file>`, each
`<outcome> <line>:<column>: <what was changed>`, outcome one of caught, missed, timeout,
unviable.
"""

import json
import os
import re
import sys

OUTCOMES = ("caught", "missed", "timeout", "unviable")
LINE = re.compile(r"^(caught|missed|timeout|unviable) +(\d+:\d+: .*)$")


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return default


def position(name):
    m = re.match(r"^[^:]+:(\d+):(\d+):", name)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def file_section(d):
    """(file, tests, seconds, only, [(outcome, name)]) of one file's folder."""
    file = read(os.path.join(d, "file")).strip()
    mutants = []
    for outcome in OUTCOMES:
        for line in read(os.path.join(d, outcome + ".txt")).splitlines():
            if line.strip():
                mutants.append((outcome, line.strip()))
    if not file and mutants:
        file = mutants[0][1].split(":", 1)[0]
    # cargo-mutants' order where outcomes.json gives it, else by position in the file.
    order = {}
    try:
        with open(os.path.join(d, "outcomes.json")) as f:
            j = json.load(f)
        for i, o in enumerate(j.get("outcomes", [])):
            name = o.get("mutant")
            sc = o.get("scenario")
            if name is None and isinstance(sc, dict) and "Mutant" in sc:
                name = sc["Mutant"]["name"]
            if name is not None:
                order.setdefault(name, i)
    except (FileNotFoundError, ValueError):
        pass
    mutants.sort(key=lambda m: (order.get(m[1], len(order)), position(m[1])))
    for _, name in mutants:
        if not name.startswith(file + ":"):
            sys.exit(f"mutants-record: {d}: {name!r} is not a mutant of {file}")
    seconds = read(os.path.join(d, "seconds")).strip()
    return (
        file,
        read(os.path.join(d, "tests")).strip(),
        int(seconds) if seconds else None,
        read(os.path.join(d, "only")).strip(),
        mutants,
    )


def run_times(run_dir):
    """(cargo-mutants version, first start, last end) over the run's outcomes.json files."""
    version, start, end = None, None, None
    for d in sorted(os.listdir(run_dir)):
        try:
            with open(os.path.join(run_dir, d, "outcomes.json")) as f:
                j = json.load(f)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            continue
        version = version or j.get("cargo_mutants_version")
        s, e = j.get("start_time"), j.get("end_time")
        start = min(start, s) if start and s else start or s
        end = max(end, e) if end and e else end or e
    return version, start, end


def write(run_dir, record, title, notes):
    sections = [
        file_section(os.path.join(run_dir, d))
        for d in sorted(os.listdir(run_dir))
        if os.path.isdir(os.path.join(run_dir, d))
    ]
    if not sections:
        sys.exit(f"mutants-record: {run_dir} holds no file's results")
    # The summary the run printed must agree with the lists, file by file.
    summary = read(os.path.join(run_dir, "summary.md"))
    for file, _, _, _, mutants in sections:
        counts = [sum(1 for o, _ in mutants if o == k) for k in OUTCOMES]
        for row in summary.splitlines():
            cells = [c.strip() for c in row.strip("|").split("|")]
            if cells and cells[0].split(" (only")[0] == file:
                # file | mutants | caught | missed | unviable | timeout | ...
                want = [int(cells[2]), int(cells[3]), int(cells[5]), int(cells[4])]
                if want != counts or int(cells[1]) != len(mutants):
                    sys.exit(f"mutants-record: {file}: summary {cells[1:6]} vs lists {counts}")
    version, start, end = run_times(run_dir)
    out = [f"# Mutation run: {title}", ""]
    when = []
    if version:
        when.append(f"cargo-mutants {version}")
    if start and end:
        when.append(f"{start[:16].replace('T', ' ')} to {end[:16].replace('T', ' ')} UTC")
    out.append(
        "Written by `scripts/mutants.sh` (`scripts/mutants-record.py`)"
        + (f"; {', '.join(when)}" if when else "")
        + ". Score: caught and timed out of viable (caught + missed + timeout)."
    )
    out += [
        "",
        "| file | mutants | caught | missed | timeout | unviable | caught of viable | minutes | tests run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for file, tests, seconds, only, mutants in sections:
        c, m, t, u = (sum(1 for o, _ in mutants if o == k) for k in OUTCOMES)
        viable = c + m + t
        score = f"{100 * (c + t) / viable:.0f}%" if viable else "-"
        minutes = f"{seconds / 60:.0f}" if seconds is not None else "-"
        name = file + (f" (only the {only} named in MUTANTS_ONLY)" if only else "")
        out.append(
            f"| {name} | {len(mutants)} | {c} | {m} | {t} | {u} | {score} | {minutes} | `{tests}` |"
        )
    for file, tests, seconds, only, mutants in sections:
        out += ["", f"## {file}", "", "```text"]
        for outcome, name in mutants:
            out.append(f"{outcome:<8} {name[len(file) + 1:]}")
        out.append("```")
    for n in notes:
        # A section of the record: its headings one level down.
        text = read(n).strip().splitlines()
        out += [""] + ["#" + l if l.startswith("#") else l for l in text]
    with open(record, "w") as f:
        f.write("\n".join(out) + "\n")


def names(record, wanted):
    file = None
    with open(record) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                file = line[3:].strip()
                continue
            m = LINE.match(line)
            if m and file and m.group(1) in wanted:
                print(f"{file}:{m.group(2)}")


def main(argv):
    if len(argv) >= 3 and argv[0] == "write":
        title, notes, rest = os.path.basename(os.path.normpath(argv[1])), [], argv[3:]
        while rest:
            if rest[0] == "--title" and len(rest) > 1:
                title, rest = rest[1], rest[2:]
            elif rest[0] == "--notes" and len(rest) > 1:
                notes.append(rest[1])
                rest = rest[2:]
            else:
                sys.exit(f"mutants-record: unknown argument {rest[0]!r}")
        write(argv[1], argv[2], title, notes)
    elif len(argv) >= 2 and argv[0] == "names":
        wanted = set(argv[2:]) or {"missed"}
        bad = wanted - set(OUTCOMES)
        if bad:
            sys.exit(f"mutants-record: no outcome {sorted(bad)} (one of {', '.join(OUTCOMES)})")
        names(argv[1], wanted)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

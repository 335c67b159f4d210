"""Regenerate every benchmark table in README.md from benchmarks/results/*.json.

    python benchmarks/report.py          # rewrite the tables between <!-- bench:NAME --> markers
    python benchmarks/report.py --check  # exit 1 if README.md is out of date

Each table block holds the command that made it, the machine, and the table itself.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from _common import RESULTS, ROOT

README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)


def render(name: str) -> str:
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    m = doc["machine"]
    gpu = m.get("gpu") or "no GPU"
    # a summary table, where a benchmark gives one, comes before the full table
    tables = [t for t in (doc.get("summary_table"), doc["table"], doc.get("note")) if t]
    return (f"`{doc['command']}` ({m['cores']} cores, {m.get('cpu', '')}, {m.get('memory_gib', '?')} GiB, {gpu})\n\n"
            + "\n\n".join(tables) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = README.read_text()
    new = BLOCK.sub(lambda mt: mt.group(1) + render(mt.group("name")) + mt.group(4), text)
    if args.check:
        if new != text:
            print("README.md tables differ from benchmarks/results: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"updated {len(BLOCK.findall(text))} tables in {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

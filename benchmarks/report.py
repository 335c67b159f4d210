"""Regenerate every benchmark figure in README.md and docs/*.md from benchmarks/results/*.json.

    python benchmarks/report.py          # rewrite the tables and figures from the results
    python benchmarks/report.py --check  # exit 1 if any is out of date, or a page states a result by hand

Two kinds of generated text:

- a table block, between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``: the command that made
  results/NAME.json, the machine, and its tables;
- a figure in a sentence or a table cell, ``<!-- fig:NAME/PATH:FORMAT -->1.83<!-- /fig -->``: the value
  at PATH in results/NAME.json, formatted with FORMAT (Python's format spec). PATH's steps are dict
  keys, list indices, or ``field=value`` (the list element whose field has that value; several
  joined by ``&``). ``fig:A over B`` is the ratio of two values, for a like-for-like ratio that the
  benchmark's table does not print.

``--check`` also reads every page for results stated by hand: a number with a unit of time, rate or
size, a percentage, or a ratio (``1.2x``, ``0.87``) outside generated text, code and inline code is
an error naming the page and line. Figures that describe a method rather than a result (an option's
default, a test's size) go in inline code or are written without those units.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from typing import Any

from _common import RESULTS, ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)
FIGURE = re.compile(r"(<!-- fig:(?P<path>[^:>]+):(?P<format>[^>]*?) -->)(?P<value>.*?)(<!-- /fig -->)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# a result stated by hand: a number with a unit of time, rate or size, a percentage, or a ratio
STATED = re.compile(r"(?<![\w.\-/])(\d+(?:[.,]\d+)*(?:\s?-\s?\d+(?:[.,]\d+)*)?\s?"
                    r"(?:x(?![\w-])|%|ms\b|us\b|s\b|min\b|[KMG]B/s\b|[KMG]iB\b|[KMG]B\b|images/s\b|img/s\b)"
                    r"|\b[01]\.\d{2}\b)")


@functools.cache
def results(name: str) -> dict[str, Any]:
    """results/NAME.json, read once however many figures quote it."""
    doc: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return doc


def render(name: str) -> str:
    doc = results(name)
    m = doc["machine"]
    gpu = m.get("gpu") or "no GPU"
    # a summary table, where a benchmark gives one, comes before the full table
    tables = [t for t in (doc.get("summary_table"), doc["table"], doc.get("latency_table"), doc.get("note")) if t]
    return (f"`{doc['command']}` ({m['cores']} cores, {m.get('cpu', '')}, {m.get('memory_gib', '?')} GiB, {gpu})\n\n"
            + "\n\n".join(tables) + "\n")


def figure(path: str, spec: str) -> str:
    """The value at ``path`` (``NAME/step/step...``) in results/NAME.json, formatted; ``A over B``:
    the ratio of two such values."""
    if " over " in path:
        top, bottom = (value_at(p.strip()) for p in path.split(" over "))
        return format(top / bottom, spec)
    return format(value_at(path), spec)


def value_at(path: str) -> Any:
    name, *steps = path.split("/")
    value: Any = results(name)
    for step in steps:
        if isinstance(value, list) and "=" in step:  # field=value, several joined by "&"
            wanted = dict(term.split("=", 1) for term in step.split("&"))
            matches = [v for v in value if all(str(v.get(k)) == w for k, w in wanted.items())]
            if len(matches) != 1:
                raise SystemExit(f"fig:{path}: {len(matches)} entries have {wanted}")
            value = matches[0]
        elif isinstance(value, list):
            value = value[int(step)]
        else:
            if step not in value:
                raise SystemExit(f"fig:{path}: no {step!r} in results/{name}.json")
            value = value[step]
    return value


def regenerate(text: str) -> str:
    text = BLOCK.sub(lambda mt: mt.group(1) + render(mt.group("name")) + mt.group(4), text)
    return FIGURE.sub(lambda mt: mt.group(1) + figure(mt.group("path"), mt.group("format")) + mt.group(5), text)


def stated_by_hand(text: str) -> list[tuple[int, str]]:
    """(line, figure) for each result a page states outside generated text and code."""
    def blank(mt: re.Match[str]) -> str:
        return "\n" * mt.group(0).count("\n")

    text = FIGURE.sub("", FENCE.sub(blank, BLOCK.sub(blank, text)))
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for mt in STATED.finditer(INLINE_CODE.sub("", line)):
            found.append((number, mt.group(0)))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    failed = False
    for page in PAGES:
        text = page.read_text()
        new = regenerate(text)
        name = page.relative_to(ROOT)
        if not args.check:
            if new != text:
                page.write_text(new)
                print(f"updated {name}")
            continue
        if new != text:
            print(f"{name}: its tables or figures differ from benchmarks/results: run python benchmarks/report.py",
                  file=sys.stderr)
            failed = True
        for line, stated in stated_by_hand(text):
            print(f"{name}:{line}: {stated!r} is not from benchmarks/results (use a fig: marker, or say it "
                  "without a result's unit)", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

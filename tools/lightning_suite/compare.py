#!/usr/bin/env python
"""Compare a mode's results with the baseline (Lightning's own Trainer).

usage: python tools/lightning_suite/compare.py RESULTS_DIR [--modes trainer full] [--scope core|wide]
                                              [--classification FILE] [--list]

Prints, per mode: passed / failed / skipped / excluded counts; of the tests that pass under
`baseline`, how many pass under the mode; and (with --list) each test that passes under baseline
but not under the mode, with the first line of its failure. With --classification (a JSON file
mapping test id -> {"kind": "a"|"b", "gap": "...", ...}, see classification.json) the failures
are grouped: (a) exception type/wording only, (b) behaviour gaps by gap, (i) the test reaches Lightning's
private objects through code the scope rule does not read, (?) not yet classified.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scope as scope_rules  # noqa: E402


PREFIXES: tuple[str, ...] = ()


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    if PREFIXES and "tests" in data:
        data["tests"] = {t: r for t, r in data["tests"].items() if t.startswith(PREFIXES)}
    return data


def counts(tests: dict) -> collections.Counter:
    return collections.Counter(rec["outcome"] or "unknown" for rec in tests.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--modes", nargs="+", default=["trainer", "full"])
    p.add_argument("--classification", type=Path, default=None)
    p.add_argument("--scope", choices=sorted(scope_rules.SCOPES), default=None,
                   help="count only tests under this scope's paths (e.g. `core` out of a `wide` run)")
    p.add_argument("--list", action="store_true", help="list every baseline-pass test that fails under the mode")
    args = p.parse_args()
    global PREFIXES
    if args.scope:
        PREFIXES = tuple(scope_rules.SCOPES[args.scope])

    base = load(args.results / "baseline.json")
    base_pass = {t for t, r in base["tests"].items() if r["outcome"] == "passed"}
    c = counts(base["tests"])
    print(f"Lightning {base['lightning']}; ours at {base['ours_commit']}")
    print(f"baseline: {dict(sorted(c.items()))}  -> yardstick: {len(base_pass)} tests pass with Lightning's Trainer")
    classification = json.loads(args.classification.read_text()) if args.classification else {}
    classification = {t: e for t, e in classification.items() if not t.startswith("_")}

    for mode in args.modes:
        path = args.results / f"{mode}.json"
        if not path.exists():
            print(f"\n{mode}: no results ({path})")
            continue
        res = load(path)
        tests = res["tests"]
        c = counts(tests)
        ok = {t for t in base_pass if tests.get(t, {}).get("outcome") == "passed"}
        lost = sorted(base_pass - ok)
        print(f"\n== {mode} (ours at {res['ours_commit']}; swapped: {len(res['swapped'])} names)")
        print(f"all outcomes: {dict(sorted(c.items()))}")
        print(f"of {len(base_pass)} baseline passes: {len(ok)} pass ({100 * len(ok) / max(1, len(base_pass)):.1f}%), "
              f"{len(lost)} do not")
        extra = sorted(t for t, r in tests.items() if r["outcome"] == "passed" and t not in base_pass)
        if extra:
            print(f"(and {len(extra)} pass with ours but not with Lightning's Trainer)")
        if classification:
            kinds = collections.Counter(classification.get(t, {}).get("kind", "?") for t in lost)
            a = kinds.get("a", 0)
            print(f"(a) wording/exception type only: {a}; (b) behaviour gaps: {kinds.get('b', 0)}; "
                  f"(i) internals the scope rule missed: {kinds.get('i', 0)}; "
                  f"unclassified: {kinds.get('?', 0)}; excluding (a): {len(ok)}/{len(base_pass) - a} "
                  f"({100 * len(ok) / max(1, len(base_pass) - a):.1f}%)")
            gaps = collections.defaultdict(list)
            for t in lost:
                entry = classification.get(t, {})
                if entry.get("kind") == "b":
                    gaps[entry.get("gap", "?")].append(t)
            for gap, ids in sorted(gaps.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                print(f"  [{len(ids):3d}] {gap}")
        if args.list:
            for t in lost:
                r = tests.get(t, {"outcome": "missing"})
                tag = classification.get(t, {}).get("kind", "?") if classification else ""
                where = r.get("phase", "")
                print(f"  {tag:1s} {t}\n      {r['outcome']}{'@' + where if where else ''}: {r.get('message', r.get('reason', ''))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

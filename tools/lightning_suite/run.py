#!/usr/bin/env python
"""Run Lightning's tests_pytorch (in scope) with Lightning's Trainer or ours swapped in.

usage: python tools/lightning_suite/run.py TESTS_DIR MODE [--out DIR] [--timeout S] [--extra-path P] [-- PYTEST_ARGS...]

TESTS_DIR: Lightning's `tests` directory (the one holding `tests_pytorch/`), or `tests_pytorch` itself.
MODE: baseline | trainer | full.  Writes DIR/MODE.json and DIR/MODE.log (DIR defaults to
TESTS_DIR/../../results/SCOPE, i.e. beside the extracted sources, outside this repository).
PYTEST_ARGS after `--` are passed to pytest; if one names a path under tests_pytorch the default scope
(the --scope list) is dropped, e.g. `-- tests_pytorch/loops/test_loops.py -k resume`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import scope  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tests_dir", type=Path)
    p.add_argument("mode", choices=["baseline", "trainer", "full"])
    p.add_argument("--scope", choices=sorted(scope.SCOPES), default="wide",
                   help="which list of test paths (scope.py); `core` is the earlier harness's list")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--timeout", type=int, default=120, help="per-test timeout in seconds (pytest-timeout)")
    p.add_argument("--extra-path", action="append", default=[],
                   help="directory prepended to PYTHONPATH (e.g. packages Lightning's tests import, installed with pip --target)")
    args = p.parse_args(argv)

    tests_dir = args.tests_dir.resolve()
    if tests_dir.name == "tests_pytorch":
        tests_dir = tests_dir.parent
    if not (tests_dir / "tests_pytorch" / "conftest.py").is_file():
        p.error(f"{tests_dir} does not hold tests_pytorch/conftest.py")
    out = (args.out or tests_dir.parent.parent / "results" / args.scope).resolve()
    out.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), *map(str, args.extra_path),
                                         *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["LIGHTNING_SUITE_MODE"] = args.mode
    env["LIGHTNING_SUITE_RESULTS"] = str(out / f"{args.mode}.json")
    for var in ("PL_RUN_STANDALONE_TESTS", "RUN_ONLY_CUDA_TESTS", "PL_RUN_TPU_TESTS"):
        env.pop(var, None)
    env.setdefault("CUDA_VISIBLE_DEVICES", "")

    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "swap_plugin",
           f"--timeout={args.timeout}", "-o", "xfail_strict=true", "--disable-pytest-warnings",
           "-q", "-rN", "--color=no", *([] if any(a.startswith("tests_pytorch") for a in extra) else scope.SCOPES[args.scope]), *extra]
    print("cwd:", tests_dir, "\n$", " ".join(cmd), flush=True)
    with open(out / f"{args.mode}.log", "w") as log:
        proc = subprocess.run(cmd, cwd=tests_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"pytest exit {proc.returncode}; results {out / (args.mode + '.json')}, log {out / (args.mode + '.log')}")
    return 0 if proc.returncode in (0, 1) else proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())

"""Mutation testing of the modules where money and access are at stake, with cosmic-ray.

    .venv/bin/python bench/mutation.py [MODULE ...] [--timeout 120]

Each module (default: all of :data:`TARGETS`) is mutated in a scratch copy of the tree,
never in place; every mutant runs the tests that speak for that module. The table
gives, per module, the mutants made, killed, survived and timed out, and the score.
Survivors are listed (``cr-report``) under the table: each is a missing test or a change
that does not alter behaviour (say which in docs/development.md).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# module -> the tests that speak for it
TARGETS = {
    "chatparity/gateway/auth.py": "tests/gateway/test_auth.py tests/transport/test_views.py",
    "chatparity/accounting/keys.py": "tests/accounting/test_keys.py tests/transport/test_views.py",
    "chatparity/accounting/limits.py": "tests/accounting/test_limits.py",
    "chatparity/accounting/spool.py": "tests/accounting/test_spool.py",
    "chatparity/accounting/journal.py": "tests/accounting/test_spool.py",
    "chatparity/gateway/responses.py": "tests/gateway/test_responses.py",
}

CONFIG = """[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{python} -m pytest -x -q -p no:cacheprovider -p no:randomly {tests}"

[cosmic-ray.distributor]
name = "local"
"""


def mutate(module: str, tests: str, timeout: float, scratch: Path) -> tuple[dict[str, int], str]:
    """Run every mutant of ``module``: the counts, and cosmic-ray's report."""
    tree = scratch / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(
        ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", ".cache", "__pycache__")
    )
    config, session = scratch / "config.toml", scratch / f"{Path(module).stem}.sqlite"
    config.write_text(
        CONFIG.format(module=module, timeout=timeout, python=sys.executable, tests=tests)
    )
    session.unlink(missing_ok=True)
    subprocess.run([BIN / "cosmic-ray", "init", config, session], cwd=tree, check=True)
    subprocess.run([BIN / "cosmic-ray", "exec", config, session], cwd=tree, check=True)
    report = subprocess.run(
        [BIN / "cr-report", session, "--show-pending"], cwd=tree, capture_output=True, text=True
    ).stdout
    counts = {"made": 0, "killed": 0, "survived": 0, "timeout": 0}
    for line in report.splitlines():
        if line.startswith("[job-id]"):
            counts["made"] += 1
        elif "test outcome: TestOutcome.KILLED" in line:
            counts["killed"] += 1
        elif "test outcome: TestOutcome.SURVIVED" in line:
            counts["survived"] += 1
        elif "WorkerOutcome.ABNORMAL" in line or "timeout" in line.lower():
            counts["timeout"] += 1
    return counts, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(TARGETS))
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    rows, reports = [], []
    with tempfile.TemporaryDirectory(prefix="chatparity-mutation-") as folder:
        for module in args.modules:
            counts, report = mutate(module, TARGETS[module], args.timeout, Path(folder))
            rows.append((module, counts))
            reports.append(report)
    print("| module | mutants | killed | survived | timed out | score |")
    print("|---|---|---|---|---|---|")
    for module, c in rows:
        score = (c["killed"] + c["timeout"]) / c["made"] if c["made"] else 0.0
        print(
            f"| {module} | {c['made']} | {c['killed']} | {c['survived']} | {c['timeout']} "
            f"| {score:.0%} |"
        )
    for report in reports:
        print("\n" + "\n".join(line for line in report.splitlines() if "SURVIVED" in line))


if __name__ == "__main__":
    main()

"""Mutation testing of the modules where money and access are at stake, with cosmic-ray.

    .venv/bin/python bench/mutation.py [MODULE ...] [--only NAME ...] [--skip-operators RE]
                                       [--timeout 120] [--session-dir DIR [--again]]

Each module (default: all of :data:`TARGETS`) is mutated in a scratch copy of the
committed tree (``git archive HEAD``: commit first; never the shared working tree, where
others' edits in progress may fail the tests, and never in place); the copy's tests must
pass unmutated, then every mutant runs the tests that speak for that module. ``--only``
mutates only the named functions, classes or methods (``Class.method``) of the modules
given, and ``--skip-operators`` leaves out the operators whose name (``core/...``) the
regular expression matches, for a module too large to run whole on the machine at hand
(the table says which were chosen). Mutants of type
annotations are skipped: the modules import ``annotations`` from ``__future__``, so an
annotation is never evaluated and no test could tell ``int | None`` from ``int & None``.
``--session-dir`` keeps the copies and cosmic-ray's sessions there: a run cut short
goes on from where it stopped when started again with the same arguments, and
``--again`` runs the survivors of a kept session again on HEAD's tests (after a test
was added; the module itself must not have changed).

The table gives, per module, the mutants made (annotations left out), killed, survived
and timed out (counted as killed: the tests noticed), and the score. Each survivor is
printed with its diff: a missing test, or a change that does not alter behaviour (say
which in docs/development.md).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkResult

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# The writer and the spool over a PostgreSQL of its own that it stops (10 s): the spool's
# own tests speak for each of its lines.
WITHOUT_OUTAGE = (
    "--deselect",
    "tests/accounting/test_spool.py::test_no_row_is_lost_over_a_postgresql_outage",
)
# A killed worker's journal recovered: its requests settled on their prompt, each counted
# on the day it ran.
KILLED_WORKER = (
    "tests/accounting/test_settlement.py::test_a_killed_workers_request_is_settled_on_its_prompt",
    "tests/accounting/test_rollups.py"
    "::test_a_killed_workers_requests_count_as_interrupted_on_the_day_they_ran",
)
# The spool folder as the checks, the metrics and a starting site judge it, and rows
# spooled days ago counted on their own day.
SPOOL_FOLDER = (
    "tests/test_checks.py::test_a_spool_folder_of_this_users_alone_passes",
    "tests/test_checks.py::test_a_spool_folder_chatparity_would_refuse_is_an_error",
    "tests/metrics/test_views.py::SpoolTests",
    "tests/test_deploy.py"
    "::test_a_spool_folder_linked_to_a_private_folder_passes_and_is_resolved_at_start",
    "tests/test_deploy.py::test_a_spool_folder_linked_into_a_shared_folder_stops_the_site_at_start",
    "tests/accounting/test_rollups.py"
    "::test_rows_spooled_days_ago_count_on_their_own_day_once_drained",
)
# module -> the tests that speak for it, the quickest to fail first (pytest stops there)
TARGETS: dict[str, tuple[str, ...]] = {
    "chatparity/gateway/auth.py": ("tests/gateway/test_auth.py", "tests/transport/test_views.py"),
    "chatparity/accounting/keys.py": (
        "tests/accounting/test_keys.py",
        "tests/transport/test_views.py",
        "tests/accounting/test_plans.py",
        "tests/portal/test_keys.py::PlanLossTests",
        "tests/metrics/test_instruments.py::RequestMetricsTests",
    ),
    # The limits and key budgets; owner budgets (plans); what a request is reserved and
    # charged on every wire; the bytes a key's stored responses hold.
    "chatparity/accounting/limits.py": (
        "tests/accounting/test_limits.py",
        "tests/accounting/test_plans.py",
        "tests/accounting/test_settlement.py",
        "tests/gateway/test_responses_limits.py",
    ),
    # Settled, written, announced, once; its observers (metrics, traces); a client that
    # leaves; a fallback's admission; the gateway's use of it.
    "chatparity/accounting/ledger.py": (
        "tests/accounting/test_ledger.py",
        "tests/test_signals.py",
        "tests/accounting/test_settlement.py",
        "tests/transport/test_disconnect.py",
        "tests/metrics/test_instruments.py",
        "tests/tracing/test_spans.py",
        "tests/accounting/test_limits.py::FallbackTests",
        "tests/gateway/test_pipeline.py",
    ),
    # A request's row: its usage settled, its columns as the transports and the gateway
    # fill them, what the response cache saved.
    "chatparity/accounting/record.py": (
        "tests/accounting/test_record.py",
        "tests/accounting/test_settlement.py",
        "tests/accounting/test_ledger.py",
        "tests/transport/test_fastpath.py",
        "tests/transport/test_views.py",
        "tests/gateway/test_pipeline.py",
        "tests/gateway/test_cache.py::AnsweredFromTheCache",
        "tests/gateway/test_cache.py::Embeddings",
    ),
    "chatparity/accounting/settlement.py": ("tests/accounting/test_settlement.py",),
    "chatparity/accounting/spool.py": (
        "tests/accounting/test_spool.py",
        *WITHOUT_OUTAGE,
        *SPOOL_FOLDER,
    ),
    "chatparity/accounting/journal.py": (
        "tests/accounting/test_spool.py",
        *WITHOUT_OUTAGE,
        *KILLED_WORKER,
    ),
    # The rollups summed and rebuilt; the reports, the commands and the budgets that read
    # them (a budget is seeded from its key's rollups).
    "chatparity/accounting/rollups.py": (
        "tests/accounting/test_rollups.py",
        "tests/accounting/test_reports.py",
        "tests/test_commands.py",
        "tests/accounting/test_limits.py::BudgetTests",
    ),
    "chatparity/gateway/responses.py": (
        "tests/gateway/test_responses.py",
        "tests/gateway/test_responses_limits.py",
        "tests/backends/test_upstream_responses.py::NativeResponsesTests",
    ),
}
# Plugins these tests do not use, which cost each mutant's run seconds to import.
PYTEST = (
    "-x -q -p no:cacheprovider -p no:randomly"
    " -p no:langsmith_plugin -p no:hypothesispytest -p no:schemathesis"
)

# Bytecode written and read (the shell may say not to), so that each run imports the
# unchanged modules compiled, not from source.
ENVIRONMENT = {
    name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"
}

CONFIG = """[cosmic-ray]
module-path = "{module}"
timeout = {timeout}
excluded-modules = []
test-command = "{command}"

[cosmic-ray.distributor]
name = "local"
"""

Span = tuple[tuple[int, int], tuple[int, int]]


def mutate(
    module: str,
    tests: tuple[str, ...],
    selection: Selection,
    timeout: float,
    scratch: Path,
    again: bool,
) -> tuple[dict[str, int], list[str]]:
    """Run every mutant of ``module`` (those ``selection`` chooses), or ``again`` those
    that survived: the counts, and the survivors' diffs."""
    stem = Path(module).stem
    tree, config = scratch / f"{stem}-tree", scratch / f"{stem}.toml"
    session = scratch / f"{stem}-{selection.key()}.sqlite"
    original = scratch / f"{stem}.original.py"
    if session.exists() and not again:  # a run cut short, maybe with a mutant in place
        shutil.copyfile(original, tree / module)
    else:
        assert session.exists() or not again, f"no session of {module} to run again"
        _copy_committed_tree(tree)
        if again:
            assert (tree / module).read_bytes() == original.read_bytes(), (
                f"{module} changed since its mutants were made: run them all"
            )
        shutil.copyfile(tree / module, original)
        test_command = f"{sys.executable} -m pytest {PYTEST} {' '.join(tests)}"
        baseline = subprocess.run(test_command.split(), cwd=tree, env=ENVIRONMENT)
        assert baseline.returncode == 0, f"the tests of {module} fail unmutated"
        config.write_text(CONFIG.format(module=module, timeout=timeout, command=test_command))
        if again:
            with closing(sqlite3.connect(session)) as database, database:
                database.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
        else:
            subprocess.run([BIN / "cosmic-ray", "init", config, session], cwd=tree, check=True)
            _skip_unwanted(session, (tree / module).read_text(), selection)
    subprocess.run(
        [BIN / "cosmic-ray", "exec", config, session], cwd=tree, env=ENVIRONMENT, check=True
    )
    return _results(session)


def _copy_committed_tree(tree: Path) -> None:
    """HEAD's files in ``tree``, compiled to bytecode checked against its source's hash:
    each run imports the modules unchanged from it, and recompiles the mutated one (a
    mutant of the same size, written within the same second, has another hash)."""
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", "."],
        cwd=tree,
        stdout=subprocess.DEVNULL,
        check=True,
    )


@dataclass(frozen=True)
class Selection:
    """The mutants run: of the functions named in ``only`` (all if none), by operators
    ``skip_operators`` does not match."""

    only: tuple[str, ...] = ()
    skip_operators: str = ""

    def key(self) -> str:
        """A name for the session of this selection."""
        if not self.only and not self.skip_operators:
            return "all"
        chosen = "|".join(self.only) + "/" + self.skip_operators
        return "selected-" + hashlib.sha256(chosen.encode()).hexdigest()[:8]

    def __str__(self) -> str:
        parts = [", ".join(self.only)] if self.only else []
        if self.skip_operators:
            parts.append(f"operators not matching {self.skip_operators}")
        return "; ".join(parts)


def _skip_unwanted(session: Path, source: str, selection: Selection) -> None:
    """Mark as skipped the mutants of annotations, and those ``selection`` leaves out."""
    tree = ast.parse(source)
    annotations = list(_annotation_spans(tree))
    wanted = list(_named_spans(tree, list(selection.only))) if selection.only else None
    skipping = re.compile(selection.skip_operators) if selection.skip_operators else None
    skipped = WorkResult(worker_outcome=WorkerOutcome.SKIPPED)
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            for mutation in item.mutations:
                if (
                    any(_within(mutation, span) for span in annotations)
                    or (wanted is not None and not any(_within(mutation, s) for s in wanted))
                    or (skipping is not None and skipping.search(mutation.operator_name))
                ):
                    db.set_result(item.job_id, skipped)


def _annotation_spans(tree: ast.Module) -> Iterator[Span]:
    assert any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    ), "annotations are evaluated in this module: their mutants count"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            for argument in [
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
                arguments.vararg,
                arguments.kwarg,
            ]:
                if argument is not None and argument.annotation is not None:
                    yield _span(argument.annotation)
            if node.returns is not None:
                yield _span(node.returns)
        elif isinstance(node, ast.AnnAssign):
            yield _span(node.annotation)


def _named_spans(tree: ast.Module, names: list[str]) -> Iterator[Span]:
    """The spans of the functions and classes named (``Class.method`` for a method)."""
    found = set()

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[Span]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + node.name
                if name in names or node.name in names:
                    found.add(name if name in names else node.name)
                    yield _span(node)
                elif isinstance(node, ast.ClassDef):
                    yield from walk(node.body, f"{name}.")

    yield from walk(tree.body, "")
    missing = set(names) - found
    assert not missing, f"not in the module: {', '.join(sorted(missing))}"


def _span(node: ast.expr | ast.stmt) -> Span:
    assert node.end_lineno is not None
    assert node.end_col_offset is not None
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def _within(mutation: MutationSpec, span: Span) -> bool:
    start, end = span
    return start <= tuple(mutation.start_pos) and tuple(mutation.end_pos) <= end


def _results(session: Path) -> tuple[dict[str, int], list[str]]:
    counts = {"made": 0, "killed": 0, "survived": 0, "timeout": 0, "pending": 0}
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        done = {item.job_id: result for item, result in db.completed_work_items}
        for item in db.work_items:
            result = done.get(item.job_id)
            if result is not None and result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            counts["made"] += 1
            if result is None:
                counts["pending"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                counts["survived"] += 1
                [mutation] = item.mutations
                survivors.append(
                    f"{mutation.module_path}:{mutation.start_pos[0]} "
                    f"{mutation.operator_name}\n{result.diff}"
                )
            elif result.output == "timeout":
                counts["timeout"] += 1
            else:
                counts["killed"] += 1
    return counts, survivors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(TARGETS))
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME")
    parser.add_argument("--skip-operators", default="", metavar="RE")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--session-dir", type=Path)
    parser.add_argument("--again", action="store_true")
    args = parser.parse_args()
    selection = Selection(tuple(args.only), args.skip_operators)
    rows, survivors = [], []
    with tempfile.TemporaryDirectory(prefix="chatparity-mutation-") as temporary:
        scratch = args.session_dir or Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        for module in args.modules:
            counts, diffs = mutate(
                module, TARGETS[module], selection, args.timeout, scratch, args.again
            )
            rows.append((module, counts))
            survivors.extend(diffs)
    print("| module | mutants | killed | survived | timed out | score |")
    print("|---|---|---|---|---|---|")
    for module, c in rows:
        tested = c["made"] - c["pending"]
        score = (c["killed"] + c["timeout"]) / tested if tested else 0.0
        pending = f" ({c['pending']} not run)" if c["pending"] else ""
        print(
            f"| {module}{f' ({selection})' if str(selection) else ''} | {c['made']}"
            f"{pending} | {c['killed']} | {c['survived']} | {c['timeout']} | {score:.0%} |"
        )
    for diff in survivors:
        print(f"\nSURVIVED {diff}")


if __name__ == "__main__":
    main()

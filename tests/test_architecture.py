"""The shape of the package, checked: no import cycle between its modules (imports inside
functions count, ``TYPE_CHECKING`` blocks do not), no module over 400 lines, no function
over 60 lines, and no SQL text outside ``store/`` and the migrations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "celery_grousset"
SQL = re.compile(
    r"\b(SELECT\s+\S.*\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
    r"clock_timestamp|statement_timestamp|UTC_TIMESTAMP|pg_class|pg_terminate_backend)\b",
    re.DOTALL,
)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import a, b`: each name that is a module is an edge; the rest
            # (functions, classes) are an edge to pkg itself
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            targets = (subs & known) | ({node.module} if subs - known else set())
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], dict.fromkeys(graph, 0), []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                found.append([*stack[stack.index(nxt):], nxt])
            elif state[nxt] == 0:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    # a package imports its own submodules; that is not a cycle back from them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert cycles(graph) == []


def test_the_guard_imports_nothing_from_its_callers() -> None:
    mods = modules()
    assert not imports("celery_grousset.guard", mods["celery_grousset.guard"], set(mods)) & {
        "celery_grousset.task", "celery_grousset.protect", "celery_grousset.admin",
    }  # fmt: skip


def test_modules_and_functions_stay_small() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in modules().values()}
    long_files = {name: n for name, n in sizes.items() if n > 400}
    long_functions = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{path.name}:{node.name} ({length} lines)")
    assert long_files == {} and long_functions == []


def test_no_sql_text_outside_the_store() -> None:
    offenders = []
    for name, path in modules().items():
        if name.startswith("celery_grousset.store"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and SQL.search(node.value):  # type: ignore[attr-defined]
                offenders.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert offenders == []


def test_the_import_graph_sees_every_imported_module() -> None:
    # The cycle check above must see each name of a `from package import a, b` line.
    mods = modules()
    edges = imports("celery_grousset.task", mods["celery_grousset.task"], set(mods))
    assert {"celery_grousset.guard", "celery_grousset.events"} <= edges
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_the_sql_check_sees_sql() -> None:
    # The check above must be able to fail.
    assert SQL.search("DELETE FROM celery_grousset_outcome WHERE id = 1")
    assert SQL.search("SELECT clock_timestamp()")
    assert not SQL.search("select the rows to delete from the journal")


LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def event_lines_outside_emit(source: str) -> list[int]:
    """The lines of ``source`` that log a ``grousset.*`` event by hand (a logger call
    whose message starts with it), not through :func:`celery_grousset.events.emit`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in LOG_METHODS or not isinstance(node.func.value, ast.Name):
            continue
        texts = [a.value for a in node.args[:2]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)]  # fmt: skip
        if any(text.startswith("grousset.") for text in texts):
            found.append(node.lineno)
    return found


def test_every_event_line_carries_its_fields() -> None:
    """docs/operations.md: each event of the log table carries its fields on the record
    (``record.grousset``), which only ``events.emit`` puts there."""
    offenders = [f"{path.name}:{line}" for name, path in modules().items()
                 if name != "celery_grousset.events"
                 for line in event_lines_outside_emit(path.read_text())]  # fmt: skip
    assert offenders == []
    # (the check can fail)
    assert event_lines_outside_emit('logger.info("grousset.outbox_sent count=%d", 1)') == [1]

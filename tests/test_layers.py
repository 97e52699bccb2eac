"""The layers of herdscope, checked by reading the source (an ``ast`` walk, nothing is imported).

``analyzer/`` reads, decodes and builds frames; ``detectors/`` judges them; the faces (the command line
and ``dashboards/``) sit on top; ``samples/`` makes and checks captures. The rules:

- **(a) analyzer is the bottom layer**: no module of ``analyzer/`` imports ``detectors``,
  ``dashboards``, ``samples`` or ``tests``, except the entry point (``analyzer/cli.py`` and
  ``analyzer/__main__.py``), which parses the command line and dispatches.
- **(b) detectors sit on analyzer only**: ``detectors/`` imports ``analyzer``, itself, the standard
  library and third-party packages; never ``dashboards``, ``samples`` or the tests.
- **(c) private stays private**: no module imports a ``_private`` name (or a ``_private`` module) of
  another module, nor reads ``module._private`` through a module it imported.
- **(d) analyzer's module-level imports form no cycle**, and every module-level import of an
  ``analyzer/`` module comes before its first ``def`` or ``class`` (a bottom-of-file import is a
  cycle held together by import order).
- **(e) no import inside a function dodges a cycle**: a function-level import that, moved to the top
  of its module, would close a cycle of module-level imports is flagged (anywhere in the four
  packages); and every function-level import in ``analyzer/`` says why it is lazy with a ``# lazy:``
  comment on its line (start-up speed: ``herdscope --help`` must not load Polars or Numba).
- **(f) modules stay under 600 lines** (one job each), unless ``LONG_MODULES`` says why.

Each failure names the file, the line and the rule.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzer", "detectors", "dashboards", "samples")
LAZY_MARKER = "# lazy:"  # the comment that says why an import inside a function is deferred
ENTRY_POINTS = {"analyzer.cli", "analyzer.__main__"}  # the one allowed exception to rule (a)
# top-level names that belong to this checkout (the tests' own modules are imported by bare name)
TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"tests"}
# samples/ scripts put samples/ itself on sys.path: `from realkit import core` is samples.realkit.core
SAMPLES_TOP = {p.stem for p in (ROOT / "samples").glob("*.py")} | {
    p.parent.name for p in (ROOT / "samples").glob("*/__init__.py")}
FIRST_PARTY = set(PACKAGES) | TEST_MODULES | SAMPLES_TOP


def canonical(module: str) -> str:
    """The dotted name of an imported module as this walk names files (``realkit.x`` -> ``samples.realkit.x``)."""
    return f"samples.{module}" if module.split(".")[0] in SAMPLES_TOP else module


@dataclass(frozen=True)
class Import:
    """One imported module (and, for ``from M import n``, one name) at one line of one file."""
    path: Path
    line: int
    module: str  # absolute dotted name of the module imported from
    name: str | None  # the name imported from it (``from M import name``), None for ``import M``
    in_function: bool
    in_type_checking: bool
    after_first_def: bool  # a module-level import below the module's first def/class
    lazy_marked: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def resolve(path: Path, module: str | None, level: int) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in ``path``."""
    if level == 0:
        return module or ""
    base = module_name(path).split(".")
    if not is_package(path):
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def source_files() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        files += sorted(p for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    return files


KNOWN_MODULES: set[str] = set()


def _known_modules() -> set[str]:
    if not KNOWN_MODULES:
        KNOWN_MODULES.update(module_name(p) for p in source_files())
    return KNOWN_MODULES


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Walker(ast.NodeVisitor):
    """Every import of one file, with where it stands (module level or in a function)."""

    def __init__(self, path: Path, source: str):
        self.path, self.lines = path, source.splitlines()
        self.imports: list[Import] = []
        self.private_attributes: list[tuple[int, str, str]] = []  # (line, module alias, attribute)
        self.function_depth = 0
        self.type_checking = 0
        self.after_first_def = False
        self.module_aliases: dict[str, str] = {}  # local name -> first-party module it is bound to

    def run(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            self.visit(stmt)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.after_first_def = True

    def _scope(self, node):
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scope

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.type_checking += 1
            for stmt in node.body:
                self.visit(stmt)
            self.type_checking -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def _marked(self, node: ast.stmt) -> bool:
        return any(LAZY_MARKER in self.lines[k - 1] for k in range(node.lineno, (node.end_lineno or node.lineno) + 1))

    def _add(self, node, module: str, name: str | None) -> None:
        module = canonical(module)
        self.imports.append(Import(self.path, node.lineno, module, name, self.function_depth > 0,
                                   self.type_checking > 0, self.after_first_def and self.function_depth == 0,
                                   self._marked(node)))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name, None)
            if alias.name.split(".")[0] in FIRST_PARTY:
                self.module_aliases[alias.asname or alias.name.split(".")[0]] = canonical(
                    alias.name if alias.asname else alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = resolve(self.path, node.module, node.level)
        for alias in node.names:
            self._add(node, module, alias.name)
            full = canonical(f"{module}.{alias.name}")
            if full in _known_modules():
                self.module_aliases[alias.asname or alias.name] = full

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("a.b") with a literal name is an import too
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            self.imports.append(Import(self.path, node.lineno, canonical(node.args[0].value), None,
                                       self.function_depth > 0, self.type_checking > 0, False, True))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.module_aliases and _private(node.attr):
            self.private_attributes.append((node.lineno, self.module_aliases[node.value.id], node.attr))
        self.generic_visit(node)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.fixture(scope="module")
def walked() -> dict[Path, _Walker]:
    out = {}
    for path in source_files():
        source = path.read_text()
        walker = _Walker(path, source)
        walker.run(ast.parse(source, filename=str(path)))
        out[path] = walker
    return out


def _all_imports(walked) -> list[Import]:
    return [imp for w in walked.values() for imp in w.imports]


def _fail_with(problems: list[str], rule: str) -> None:
    problems = list(dict.fromkeys(problems))  # one line per problem (``from m import a, b`` is one import)
    assert not problems, f"rule {rule}: {len(problems)} problem(s)\n" + "\n".join(problems)


def test_walk_sees_the_packages(walked):
    """The walk reads every package and finds their imports (a walk that saw nothing would pass)."""
    names = {module_name(p) for p in walked}
    assert {"analyzer.cli", "analyzer.capture", "detectors", "detectors.base", "dashboards.launch"} <= names
    assert sum(len(w.imports) for w in walked.values()) > 200
    cli = walked[ROOT / "analyzer" / "cli.py"]
    assert any(imp.top == "detectors" and imp.in_function for imp in cli.imports)


# --- (a) and (b): who may import whom ------------------------------------------------------------------

def test_a_analyzer_imports_no_upper_layer(walked):
    problems = [f"{imp.where}: rule (a) analyzer/ must not import {imp.module}"
                f"{'.' + imp.name if imp.name else ''} (only {', '.join(sorted(ENTRY_POINTS))}, the entry point, "
                f"may reach detectors/dashboards)"
                for imp in _all_imports(walked)
                if module_name(imp.path).split(".")[0] == "analyzer" and module_name(imp.path) not in ENTRY_POINTS
                and imp.top in FIRST_PARTY - {"analyzer"}]
    _fail_with(problems, "(a)")


def test_b_detectors_import_only_analyzer(walked):
    problems = [f"{imp.where}: rule (b) detectors/ may import analyzer, detectors, the standard library and "
                f"third-party packages, not {imp.module}"
                for imp in _all_imports(walked)
                if module_name(imp.path).split(".")[0] == "detectors"
                and imp.top in FIRST_PARTY - {"analyzer", "detectors"}]
    _fail_with(problems, "(b)")


# --- (c): private names stay in their module -----------------------------------------------------------

def test_c_no_private_name_imported_from_another_module(walked):
    problems = []
    for w in walked.values():
        for imp in w.imports:
            private_module = [part for part in imp.module.split(".") if _private(part)]
            if private_module and imp.top in FIRST_PARTY:
                problems.append(f"{imp.where}: rule (c) imports the private module {imp.module}")
            if imp.name and _private(imp.name) and imp.module != module_name(imp.path):
                problems.append(f"{imp.where}: rule (c) imports the private name {imp.name} from {imp.module} "
                                f"(make it public, with a docstring, or keep its use in its module)")
        for line, module, attr in w.private_attributes:
            if module != module_name(w.path):
                problems.append(f"{w.path.relative_to(ROOT)}:{line}: rule (c) reads the private name "
                                f"{module}.{attr}")
    _fail_with(problems, "(c)")


# --- (d) and (e): no cycles, no bottom-of-file imports, no cycle dodged by a function-level import ------

def _targets(importer: str, imp: Import) -> list[str]:
    """The first-party modules an import makes Python run: the module (or ``module.name`` when that
    is a submodule) and its parent packages, except the importer's own enclosing packages (already
    running when a submodule is imported)."""
    known = _known_modules()
    full = f"{imp.module}.{imp.name}" if imp.name else imp.module
    target = full if full in known else imp.module
    if target.split(".")[0] not in PACKAGES:
        return []
    own = importer.split(".")
    enclosing = {".".join(own[:k]) for k in range(1, len(own))}
    parts = target.split(".")
    chain = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return [m for m in chain if m in known and m not in enclosing and m != importer]


def _module_graph(walked, package: str | None = None) -> dict[str, dict[str, Import]]:
    """importer -> {imported module: the import}, module-level imports only (TYPE_CHECKING excluded)."""
    graph: dict[str, dict[str, Import]] = {}
    for path, w in walked.items():
        importer = module_name(path)
        if package and importer.split(".")[0] != package:
            continue
        edges = graph.setdefault(importer, {})
        for imp in w.imports:
            if imp.in_function or imp.in_type_checking:
                continue
            for target in _targets(importer, imp):
                if not package or target.split(".")[0] == package:
                    edges.setdefault(target, imp)
    return graph


def _path_between(graph, start: str, goal: str) -> list[str] | None:
    """A chain of module-level imports from ``start`` to ``goal``, or None."""
    seen, stack = {start}, [(start, [start])]
    while stack:
        node, chain = stack.pop()
        if node == goal:
            return chain
        for nxt in graph.get(node, {}):
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, chain + [nxt]))
    return None


def test_d_analyzer_import_graph_has_no_cycle(walked):
    graph = _module_graph(walked, "analyzer")
    problems, reported = [], set()
    for importer, edges in sorted(graph.items()):
        for target, imp in sorted(edges.items()):
            back = _path_between(graph, target, importer)
            if back and frozenset(back) not in reported:
                reported.add(frozenset(back))
                problems.append(f"{imp.where}: rule (d) import cycle {' -> '.join([importer, *back])}")
    _fail_with(problems, "(d)")


def test_d_no_module_level_import_below_the_first_definition(walked):
    problems = [f"{imp.where}: rule (d) module-level import of {imp.module} below the first def/class "
                f"(imports go at the top; one that must wait for the code above it hides a cycle)"
                for imp in _all_imports(walked)
                if imp.after_first_def and module_name(imp.path).split(".")[0] == "analyzer"]
    _fail_with(problems, "(d)")


def test_e_no_function_level_import_dodges_a_cycle(walked):
    graph = _module_graph(walked)
    problems = []
    for path, w in sorted(walked.items()):
        importer = module_name(path)
        for imp in w.imports:
            if not imp.in_function:
                continue
            for target in _targets(importer, imp):
                back = _path_between(graph, target, importer)
                if back:
                    problems.append(f"{imp.where}: rule (e) this import inside a function dodges the cycle "
                                    f"{' -> '.join([importer, *back])} (it could not move to the top)")
    _fail_with(problems, "(e)")


def test_e_function_level_imports_in_analyzer_say_why(walked):
    problems = [f"{imp.where}: rule (e) import of {imp.module} inside a function without a '{LAZY_MARKER} why' "
                f"comment (move it to the top of the module, or say why it is deferred)"
                for imp in _all_imports(walked)
                if imp.in_function and not imp.lazy_marked and module_name(imp.path).split(".")[0] == "analyzer"]
    _fail_with(problems, "(e)")


# Modules have one job and stay short enough to read: over this many lines a module is split by job.
MAX_MODULE_LINES = 600
# module (relative path) -> why it may be longer; empty: every module fits.
LONG_MODULES: dict[str, str] = {}


def test_f_modules_stay_under_the_size_limit():
    problems = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_MODULE_LINES and rel not in LONG_MODULES:
            problems.append(f"{rel}: {lines} lines, over {MAX_MODULE_LINES} (split it by job, or say why in LONG_MODULES)")
    _fail_with(problems, "f (module size)")


# --- the rules themselves catch what they are for ------------------------------------------------------

def _walk_text(relative: str, text: str) -> _Walker:
    path = ROOT / relative  # a path inside the checkout, so that module_name() applies; nothing is written
    walker = _Walker(path, text)
    walker.run(ast.parse(text))
    return walker


def test_the_walker_sees_what_the_rules_judge():
    w = _walk_text("analyzer/example.py", (
        "import os\n"
        "from detectors.base import _finding_id\n"
        "from . import schema\n"
        "def f():\n"
        "    from .capture import open_capture  # lazy: start-up speed\n"
        "    from .summary import iso_time\n"
        "    return schema._col\n"
        "from .tcp import framing\n"))
    by_line = {imp.line: imp for imp in w.imports}
    assert by_line[2].top == "detectors" and by_line[2].name == "_finding_id" and not by_line[2].in_function
    assert by_line[3].module == "analyzer" and by_line[3].name == "schema"
    assert by_line[5].in_function and by_line[5].lazy_marked and by_line[5].module == "analyzer.capture"
    assert by_line[6].in_function and not by_line[6].lazy_marked
    assert by_line[8].after_first_def and not by_line[1].after_first_def
    assert w.private_attributes == [(7, "analyzer.schema", "_col")]


def test_cycle_search_finds_a_cycle():
    graph = {"a": {"b": None}, "b": {"c": None}, "c": {"a": None}, "d": {"a": None}}
    assert _path_between(graph, "b", "a") == ["b", "c", "a"]
    assert _path_between(graph, "a", "d") is None


def test_relative_imports_resolve():
    assert resolve(ROOT / "analyzer" / "tcp" / "framing.py", "messages", 2) == "analyzer.messages"
    assert resolve(ROOT / "analyzer" / "tcp" / "__init__.py", "framing", 1) == "analyzer.tcp.framing"
    assert resolve(ROOT / "analyzer" / "cli.py", None, 1) == "analyzer"


def test_entry_point_copy_of_the_severities_agrees():
    """The entry point writes the severities out (importing detectors would load Polars for --help):
    they must be the detectors' own, in order."""
    from analyzer.cli import SEVERITY_CHOICES
    from detectors.base import SEVERITIES

    assert tuple(SEVERITY_CHOICES) == SEVERITIES


def test_entry_point_copy_of_the_scan_formats_agrees():
    """The entry point writes scan's --format choices out (importing detectors would load Polars for
    --help): they must be the formats detectors/report.py renders, in order."""
    import click

    from analyzer.cli import scan
    from detectors.report import FORMATS

    (fmt,) = [p for p in scan.params if p.name == "fmt"]
    assert isinstance(fmt.type, click.Choice) and tuple(fmt.type.choices) == FORMATS


def test_each_rule_fails_on_a_breach():
    """Every rule, run over a made-up tree that breaks it, fails naming the file, line and rule."""
    def tree(**files):
        return {ROOT / rel: _walk_text(rel, text) for rel, text in files.items()}

    breaches = [
        (test_a_analyzer_imports_no_upper_layer, "(a)", "analyzer/fake_a.py:2",
         tree(**{"analyzer/fake_a.py": "import os\nfrom detectors import run\n"})),
        (test_b_detectors_import_only_analyzer, "(b)", "detectors/fake_b.py:1",
         tree(**{"detectors/fake_b.py": "from dashboards.launch import launch\n"})),
        (test_c_no_private_name_imported_from_another_module, "(c)", "dashboards/fake_c.py:1",
         tree(**{"dashboards/fake_c.py": "from analyzer.cli import _fail\n"})),
        (test_d_analyzer_import_graph_has_no_cycle, "(d)", "analyzer/fake_d1.py:1",
         tree(**{"analyzer/fake_d1.py": "from . import fake_d2\n", "analyzer/fake_d2.py": "from . import fake_d1\n"})),
        (test_d_no_module_level_import_below_the_first_definition, "(d)", "analyzer/fake_d.py:3",
         tree(**{"analyzer/fake_d.py": "import os\ndef f(): pass\nimport sys\n"})),
        (test_e_no_function_level_import_dodges_a_cycle, "(e)", "analyzer/fake_e1.py:2",
         tree(**{"analyzer/fake_e1.py": "def f():\n    from . import fake_e2  # lazy: says so, still a cycle\n",
                 "analyzer/fake_e2.py": "from . import fake_e1\n"})),
        (test_e_function_level_imports_in_analyzer_say_why, "(e)", "analyzer/fake_e.py:2",
         tree(**{"analyzer/fake_e.py": "def f():\n    import polars\n"})),
    ]
    KNOWN_MODULES.update(module_name(p) for _, _, _, t in breaches for p in t)  # the made-up modules exist
    try:
        for rule_test, rule, where, fake in breaches:
            with pytest.raises(AssertionError) as failed:
                rule_test(fake)
            assert f"rule {rule}" in str(failed.value) and where in str(failed.value), (rule_test.__name__, failed.value)
    finally:
        KNOWN_MODULES.clear()

"""Imports flow one way: cli -> api/render -> analysis -> synth -> canary -> planners -> dump
-> errors (AST check), and no import circle exists, between packages or between modules; `safe_text`
(the one escape for text shown from a dump) and `catalog` (every code with its entry, standard
library only) are leaves every layer may use. `results` (the commands' typed results) sits
below the analysis that computes them and the render that shows them, above canary, planners
and dump, whose types the results hold: render reads results, never the analysis.

Also: only `triton_runtime` and `triton_kernels` import triton, and only `triton_runtime`
imports `triton_kernels` (after preparing the environment), so the two cannot form a cycle;
`kvcanary --help` imports neither torch, triton nor SGLang, and no command line that runs on
numpy imports torch (their runs: tests/heavy_imports.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.heavy_imports import has_gpu_driver, imports_by_run

PACKAGE = Path(__file__).resolve().parents[1] / "kvcanary_cli"

#: What the analysis computes from: the leaves, the dump, the planners and the canary's records,
#: the serving states, the option ranges and the typed results.
_DATA = {
    "safe_text",
    "catalog",
    "errors",
    "option_values",
    "dump",
    "planners",
    "canary",
    "synth",
    "results",
}

#: layer -> package modules (prefixes) it may import.
ALLOWED = {
    "safe_text": set(),
    "catalog": set(),
    "errors": {"safe_text", "catalog"},
    # the integer ranges and choice lists the API and the options both check
    "option_values": {"errors"},
    "dump": {"safe_text", "catalog", "errors", "dump"},
    "planners": {"safe_text", "catalog", "errors", "dump", "planners"},
    "canary": {"safe_text", "catalog", "errors", "dump", "planners", "canary"},
    # serving states and scenarios: they stamp canary records and rings
    "synth": {"safe_text", "catalog", "errors", "option_values", "dump", "canary", "synth"},
    # the commands' typed results: data and small derived properties, no analysis; "" for
    # __version__ (a record names the kvcanary that made it)
    "results": {"safe_text", "catalog", "errors", "dump", "planners", "canary", "results", ""},
    "analysis": _DATA | {"analysis"},
    # the commands' typed results (their records), and the canary's hex form of a hash
    "render": {"safe_text", "catalog", "render", "results", "canary.constants"},
    "capture": {"safe_text", "catalog", "dump", "errors", "capture"},
    # engines besides SGLang, one package each: their dumps read, checked and synthesized,
    # into the shared results
    "engines": {"safe_text", "catalog", "errors", "option_values", "dump", "results", "engines"},
    # SGLang's real stack under a workload, recorded by the capture code, audited by `api`;
    # vLLM's real manager, read and audited by its engine package; "" for __version__ (its
    # report names the kvcanary that ran it)
    "soak": {
        "engines",
        "safe_text",
        "catalog",
        "errors",
        "dump",
        "capture",
        "results",
        "analysis",
        "api",
        "render",
        "cli_options",
        "option_values",
        "output",
        "soak",
        "",
    },
    # the typer options; their ranges and choices are `option_values`, which the API checks too
    "cli_options": {
        "safe_text",
        "catalog",
        "errors",
        "option_values",
        "dump.schema",
        "dump.streams",
        "planners",
        "results",
        "render",
    },
    # the app: built, run and ended (exit codes, the one-line errors); "" for __version__
    "cli_app": {"safe_text", "errors", "dump.schema", "dump.streams", "results", "output", ""},
    "api": _DATA | {"analysis", "engines", ""},  # "" for __version__
    "output": {"safe_text", "catalog", "dump.files", "dump.streams", "render"},
    # the commands declare the options only they take, with their ranges (`option_values`)
    "cli": _DATA | {"analysis", "render", "cli_options", "cli_app", "api", "output", "soak", ""},
    "__main__": {"cli"},
    "__init__": set(),
}


def layer_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _line(node: ast.AST) -> int:
    return int(getattr(node, "lineno", 0))


@functools.cache
def nodes_of(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module at `path`, parsed once per test process (the package's files
    do not change during a run; a dozen tests walk all of them)."""
    return tuple(ast.walk(ast.parse(path.read_text())))


def package_imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in nodes_of(path):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if name == "kvcanary_cli" or name.startswith("kvcanary_cli."):
                found.append((name.removeprefix("kvcanary_cli").lstrip("."), _line(node)))
            if name.split(".")[0] == "triton":
                found.append(("<triton>", _line(node)))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))
TRITON_IMPORTERS = ("triton_runtime.py", "triton_kernels.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    layer = layer_of(path)
    allowed = ALLOWED[layer]
    for target, line in package_imports(path):
        if target == "<triton>":
            assert path.name in TRITON_IMPORTERS, f"{path.name}:{line} imports triton"
            continue
        if target == "planners.triton_kernels":
            assert path.name == "triton_runtime.py", f"{path.name}:{line} imports the kernels"
        ok = any(target == a or target.startswith(a + ".") for a in allowed if a) or (
            "" in allowed and target == ""
        )
        assert ok, f"{path.relative_to(PACKAGE)}:{line} ({layer}) imports kvcanary_cli.{target}"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """`planners.base` for planners/base.py; a package's `__init__` is the package itself
    (`planners`; the top package's own is "")."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _packages_above(name: str) -> list[str]:
    """The packages Python initializes before module `name`: "" (the top), then each dotted
    prefix (`["", "planners"]` for `planners.base`)."""
    parts = name.split(".") if name else []
    return [".".join(parts[:i]) for i in range(len(parts))]


def import_graph(root: Path = PACKAGE, top: str = "kvcanary_cli") -> dict[str, set[str]]:
    """Module -> the package modules it depends on when imported, as Python runs them.

    Every import counts, inside functions and under `TYPE_CHECKING` too: a lazy import or a
    circle drawn only for the type checker is still a circle in the design. Python runs a
    package's `__init__` before any module under it, so an import reaching `a.b.c` (`import
    a.b.c`, `from a.b.c import x`) also depends on the `__init__` of `a` and `a.b` -- except
    the packages enclosing the importer, which are already running when it runs. A `from P
    import name` reads the namespace of P's `__init__`, so it depends on P even from inside P
    (while P's `__init__` is still running, its names are not there yet): a submodule that
    wants a sibling names it by its full path (`from P.sibling import x`, `import P.sibling
    as sibling`), never through its package. A package's `__init__` importing one of its own
    modules depends on it like any other importer.
    """
    modules = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    def inside(full: str) -> str | None:
        """`full` relative to the top package ("" for the top itself), None if outside."""
        if full == top:
            return ""
        return full.removeprefix(top + ".") if full.startswith(top + ".") else None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        running = set(_packages_above(name)) | ({name} if is_package else set())
        targets: set[str] = set()
        for node in nodes_of(path):
            if isinstance(node, ast.Import):
                reached = [inside(alias.name) for alias in node.names]
                read_from = None
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolved against the importer's own package
                    base = name.split(".") if is_package and name else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                    read_from = module
                elif (read_from := inside(node.module or "")) is None:
                    continue
                prefix = read_from + "." if read_from else ""
                reached = [prefix + alias.name for alias in node.names]
            else:
                continue
            for full in reached:
                if full is None:
                    continue
                target = owner(full)
                targets.add(target)
                targets.update(p for p in _packages_above(target) if p not in running)
            if read_from is not None and read_from in modules:
                targets.add(read_from)
        targets.discard(name)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_package_imports_itself_through_others() -> None:
    """Between the top-level packages and modules (dump, planners, canary, ...) too."""
    packages: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        top = name.split(".")[0]
        packages.setdefault(top, set()).update(
            t.split(".")[0] for t in targets if t.split(".")[0] != top
        )
    cycle = find_cycle(packages)
    assert cycle is None, "package circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The two tests above can fail: a circle of three is found, a chain is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def _toy_package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f'"""{relative}."""\n{text}')
    return root / "toy"


def test_the_graph_sees_a_circle_through_a_package_init(tmp_path: Path) -> None:
    """`toy.cap`'s `__init__` imports its `hook`, which reaches back through the package
    (`from toy.cap import store`): Python runs that as a circle, so the graph draws it; the
    same hook naming its sibling by its full path draws none. A module outside the package
    depends on the package's `__init__` too, and a lazy import counts."""
    files = {
        "toy/__init__.py": "",
        "toy/cap/__init__.py": "from toy.cap.hook import install\n",
        "toy/cap/hook.py": "from toy.cap import store\n",
        "toy/cap/store.py": "",
        "toy/user.py": "def f():\n    from toy.cap.store import save\n",
        "toy/rel/__init__.py": "from . import mod\n",
        "toy/rel/mod.py": "",
    }
    root = _toy_package(tmp_path / "circle", files)
    graph = import_graph(root, top="toy")
    assert find_cycle(graph) == ["cap", "cap.hook", "cap"]
    assert graph["user"] == {"cap", "cap.store"}
    assert graph["rel"] == {"rel.mod"}  # relative imports resolve too
    files["toy/cap/hook.py"] = "from toy.cap.store import save\nimport toy.cap.store as store\n"
    clean = import_graph(_toy_package(tmp_path / "clean", files), top="toy")
    assert find_cycle(clean) is None
    assert clean["cap.hook"] == {"cap.store"}  # its own package is already running


#: Where a shrunk dump's sparse tensors live: only `dump/` knows they exist. Every other layer
#: reads a dump's big tensors through `dump.tensor.StoredTensor` and never asks their kind.
SPARSE_MODULE = "dump.sparse"


def _sparse_names(path: Path) -> list[int]:
    """Lines of `path` naming the sparse implementation itself (`SparseTensor`)."""
    return [
        _line(node)
        for node in nodes_of(path)
        if (isinstance(node, ast.Name) and node.id == "SparseTensor")
        or (isinstance(node, ast.Attribute) and node.attr == "SparseTensor")
    ]


def test_only_the_dump_package_knows_the_sparse_storage() -> None:
    graph = import_graph()
    importers = {name for name, targets in graph.items() if SPARSE_MODULE in targets}
    outside = sorted(name for name in importers if name.split(".")[0] != "dump")
    assert outside == [], f"{outside} import {SPARSE_MODULE}: read through dump.tensor instead"
    assert "dump.loader" in importers  # the check sees imports (it can fail)
    named = {
        str(path.relative_to(PACKAGE)): lines
        for path in MODULES
        if layer_of(path) != "dump" and (lines := _sparse_names(path))
    }
    assert named == {}, f"modules outside dump/ name SparseTensor: {named}"


def test_nothing_imports_the_cli() -> None:
    for path in MODULES:
        if path.name in ("cli.py", "__main__.py"):
            continue
        assert all(t != "cli" for t, _ in package_imports(path)), path


def test_every_module_has_a_docstring() -> None:
    for path in MODULES:
        module = nodes_of(path)[0]
        assert isinstance(module, ast.Module), path
        assert ast.get_docstring(module), f"{path} has no module docstring"


def test_safe_text_is_a_leaf() -> None:
    assert package_imports(PACKAGE / "safe_text.py") == []


def test_the_catalog_is_a_leaf() -> None:
    assert package_imports(PACKAGE / "catalog.py") == []


def test_kernels_do_not_import_the_runtime() -> None:
    kernels = PACKAGE / "planners" / "triton_kernels.py"
    assert all(not t.startswith("planners.triton_runtime") for t, _ in package_imports(kernels))


@pytest.mark.slow
def test_help_imports_neither_torch_triton_nor_sglang() -> None:
    imported, _, _ = imports_by_run()["help"]  # the first run: a fresh interpreter's
    assert imported == []


@pytest.mark.parametrize("fmt", ["table", "json", "markdown"])
def test_inspect_imports_neither_torch_nor_triton(fmt: str) -> None:
    """`inspect` reads a dump with numpy alone: torch's import is most of a check's start."""
    imported, _, code = imports_by_run()[f"inspect-{fmt}"]
    assert [m for m in imported if m != "numpy"] == [] and code == 0


@pytest.mark.skipif(has_gpu_driver(), reason="with a GPU, compiled kernels need torch's memory")
@pytest.mark.parametrize(
    "run", ["check", "check-vectorized-json", "provenance-slot", "provenance-row"]
)
def test_check_and_provenance_never_import_torch(run: str) -> None:
    """On a CPU the whole check path (reference, interpreted Triton kernels, analysis) runs
    on numpy: torch's import alone would be about half of a production-size check."""
    imported, by_this_run, code = imports_by_run()[run]
    assert "torch" not in imported and code in (0, 1)
    if run == "check":
        assert "triton" in by_this_run  # the kernels did run, in the interpreter


def test_no_command_line_imports_pydantic() -> None:
    """typer (0.29 on) would build a pydantic adapter for each parameter's value, and import
    pydantic for it: a quarter of a second of every command's start (cli_app._Coercion)."""
    runs = imports_by_run()
    assert {name: run[0] for name, run in runs.items() if "pydantic" in run[0]} == {}


def test_timeline_help_and_run_stay_light() -> None:
    """`timeline --help` imports no numpy; a timeline (checks included, of
    examples/timeline-use-after-free) never imports torch on a CPU."""
    imported, _, code = imports_by_run()["timeline-help"]
    assert imported == [] and code == 0
    imported, _, code = imports_by_run()["timeline"]
    assert "torch" not in imported and code == 1


def test_the_analysis_reads_no_finding_details() -> None:
    """`Finding.details` is what a report shows; what the analysis itself needs of a finding
    (the full slots of an SWA finding, the kernel's raise, a canary record's cause) is a
    typed field. Copying the shown facts into a new finding is the one use allowed."""
    offenders = []
    for path in sorted((PACKAGE / "analysis").rglob("*.py")):
        for node in nodes_of(path):
            reads = (
                (isinstance(node, ast.Subscript) and _is_details(node.value))
                or (isinstance(node, ast.Attribute) and _is_details(node.value))
                or (
                    isinstance(node, ast.Compare)
                    and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                    and any(_is_details(c) for c in node.comparators)
                )
            )
            if reads:
                offenders.append(f"{path.relative_to(PACKAGE)}:{_line(node)}")
    assert offenders == [], f"reads Finding.details: {offenders}"


def _is_details(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "details"

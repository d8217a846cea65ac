"""The package's imports go only down the pipeline (docs/DESIGN.md, "The flow"):
no module imports one above it. Read from the source, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "backends" / "codec_tosa"

# the pipeline, bottom first: the root's few shared modules, then one folder per stage
# (docs/DESIGN.md, "Layout"); a folder or module may import its own floor and those below
FLOORS: tuple[tuple[str, ...], ...] = (
    ("units", "graph", "ops", "pytrees", "progress", "quiet"),
    ("commutation", "codecs", "serialization"),
    ("placement",),
    ("_passes",),
    ("spec", "planning"),
    ("arm", "runtime"),
    ("targets",),
    ("quantizer",),
    ("validation",),
    ("tools",),
    ("__init__",),
)
ROOT_MODULES_AT_MOST = 8
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of the package, function-level ones
    included: a module, or a name in one (``from codec_tosa.spec import CodecSpec``
    gives codec_tosa.spec.CodecSpec)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "codec_tosa":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "codec_tosa"]
    return found


def test_every_folder_has_a_floor_and_the_root_is_small() -> None:
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert tops - set(FLOOR) == set(), "add new folders to FLOORS (and to docs/DESIGN.md)"
    assert len(list(PACKAGE.glob("*.py"))) <= ROOT_MODULES_AT_MOST


def test_imports_go_only_down() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = FLOOR[path.relative_to(PACKAGE).parts[0].removesuffix(".py")]
        for line, name in _imported(ast.parse(path.read_text())):
            target = name.split(".")[1] if "." in name else ""
            if target in FLOOR and FLOOR[target] > here:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports codec_tosa.{target}")
    assert upward == []


def _module_name(path: Path) -> str:
    parts = ("codec_tosa", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_of(name: str, modules: set[str]) -> str | None:
    """The module of an imported dotted name: its longest prefix that is one."""
    parts = name.split(".")
    return next((m for k in range(len(parts), 1, -1) if (m := ".".join(parts[:k])) in modules), None)


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> modules it imports), or []."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(u: str) -> list[str]:
        state[u] = 1
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        path.pop()
        state[u] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_no_import_cycle_between_modules() -> None:
    """Floors allow imports sideways (tools/compiler and tools/validate live on one);
    no module may reach itself through them, even by a function-level import."""
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    modules = set(paths) - {"codec_tosa"}
    graph = {m: {d for _, name in _imported(ast.parse(paths[m].read_text()))
                 if (d := _module_of(name, modules)) is not None and d != m} for m in modules}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]  # the finder finds
    assert _cycle(graph) == []

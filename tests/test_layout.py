"""The package's imports go only down the pipeline (docs/DESIGN.md, "The flow"):
no module imports one above it. Read from the source, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "backends" / "codec_tosa"

# bottom first; modules on one floor may import each other (docs/DESIGN.md lists them)
FLOORS: tuple[tuple[str, ...], ...] = (
    ("units", "graph", "ops", "rescale", "progress", "pytrees", "vgf"),
    ("commutation", "codecs"),
    ("placement",),
    ("traffic", "calibration", "observers", "plan_meta", "provenance", "spec"),
    ("_passes",),
    ("analysis", "accounting", "serialization", "arm_adapter", "int8_targets"),
    ("backend",),
    ("planning", "partitioner", "quantizer", "simulation", "rounding_ambiguity"),
    ("runtime",),
    ("tools",),
    ("__init__",),
)
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level codec_tosa module) of every import of the package."""
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "codec_tosa":
            names = [node.module] if node.module != "codec_tosa" else [f"codec_tosa.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "codec_tosa"]
        found += [(node.lineno, n.split(".")[1]) for n in names if len(n.split(".")) > 1]
    return found


def test_every_module_has_a_floor() -> None:
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert tops - set(FLOOR) == set(), "add new modules to FLOORS (and to docs/DESIGN.md)"


def test_imports_go_only_down() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = FLOOR[path.relative_to(PACKAGE).parts[0].removesuffix(".py")]
        for line, target in _imported(ast.parse(path.read_text())):
            if target in FLOOR and FLOOR[target] > here:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports codec_tosa.{target}")
    assert upward == []

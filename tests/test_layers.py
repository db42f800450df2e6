"""The queue service's layers hold (docs/source/explanation/architecture.md, "Layers"):

- `queue_service/core/` imports the standard library, itself and `fgpu_shared.units` alone;
- `queue_service/store/` and `queue_service/engine/` never import each other, the handlers or
  the domain modules above them;
- `fgpu_shared/units.py`, which the core may use, imports the standard library alone.

Imports are read from the source (as tests/test_node_agent.py reads the agent's), relative ones
resolved, so a layer cannot be crossed by a late or conditional import either."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "queue_service"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (the code of `module`) imports, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from package import module` names that module; `from module import name`, it.
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if is_module(full) else target)
    return found


def layer_of(module: str) -> str:
    """core, store, engine, handlers, domain, or outside (another package, the stdlib)."""
    parts = module.split(".")
    if parts[0] != "queue_service":
        return "outside"
    if len(parts) > 1 and parts[1] in ("core", "store", "engine", "handlers"):
        return parts[1]
    return "domain"


def is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def as_module(name: str) -> str:
    """`name` itself when it is a module of this repository or a top-level one, else the module
    it is taken from (`from pkg.mod import function`)."""
    if is_module(name) or "." not in name:
        return name
    return name.rpartition(".")[0]


def crosses(layer: str, name: str) -> bool:
    other = layer_of(name)
    if layer == "core":
        top = name.split(".")[0]
        return not (top in STDLIB or other == "core" or name.startswith("fgpu_shared.units"))
    return layer in ("store", "engine") and other in (
        {"store", "engine"} - {layer} | {"handlers", "domain"}
    )


def faults(module: str, imports: set[str]) -> list[str]:
    """The imports of `module` that cross its layer's bounds."""
    return sorted({as_module(n) for n in imports if crosses(layer_of(module), as_module(n))})


def sources(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        if "migrations/versions" in str(path):
            continue
        yield path, module_name(path)


@pytest.mark.parametrize("layer", ["core", "store", "engine"])
def test_each_layer_imports_only_what_it_may(layer):
    crossing = {}
    for path, module in sources(SERVICE / layer):
        found = faults(module, imported_modules(path.read_text(), module, path.stem == "__init__"))
        if found:
            crossing[module] = found
    assert crossing == {}
    assert list(sources(SERVICE / layer)), f"queue_service/{layer}/ holds no module"


def test_the_shared_units_need_nothing_but_the_standard_library():
    path = ROOT / "fgpu_shared" / "units.py"
    names = imported_modules(path.read_text(), "fgpu_shared.units")
    assert {name.split(".")[0] for name in names} <= STDLIB


@pytest.mark.parametrize(
    ("module", "source", "crossing"),
    [
        ("queue_service.core.x", "import sqlalchemy", ["sqlalchemy"]),
        (
            "queue_service.core.x",
            "from ..store.models import SessionRecord",
            ["queue_service.store.models"],
        ),
        ("queue_service.core.x", "from .errors import Refusal\nimport math", []),
        (
            "queue_service.store.x",
            "from queue_service.engine import stats",
            ["queue_service.engine.stats"],
        ),
        (
            "queue_service.engine.x",
            "from ..handlers.base import BaseHandler",
            ["queue_service.handlers.base"],
        ),
        ("queue_service.engine.x", "from ..queue import QueueManager", ["queue_service.queue"]),
        ("queue_service.engine.x", "from ..core.errors import Refusal", []),
    ],
)
def test_a_crossing_is_found_however_it_is_written(module, source, crossing):
    assert faults(module, imported_modules(source, module)) == crossing

"""The queue service's layers hold (docs/source/explanation/architecture.md, "Layers"):

- `queue_service/core/` imports the standard library, itself and `fgpu_shared.units` alone;
- `queue_service/store/` and `queue_service/engine/` never import each other, the handlers or
  the domain modules above them;
- `fgpu_shared/units.py`, which the core may use, imports the standard library alone;
- only `queue_service/engine/` imports the Docker clients (`docker`, `dockerspawner`): the rest of
  the service asks the engine's modules, and catches what they raise (`engine/errors.py`);
- the spawner (`fgpu_spawner/`) never imports the service: it talks to it over HTTP.

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
#: What only `queue_service/engine/` may import: the Docker engine's clients.
ENGINE_ONLY = ("docker", "dockerspawner")


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


def engine_client_imports(module: str, imports: set[str]) -> list[str]:
    """The Docker clients `module` imports, if it is outside `queue_service/engine/`."""
    if layer_of(module) == "engine":
        return []
    return sorted(name for name in imports if name.split(".")[0] in ENGINE_ONLY)


def imports_of(path: Path, module: str) -> set[str]:
    return imported_modules(path.read_text(), module, path.stem == "__init__")


def sources(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        if "migrations/versions" in str(path):
            continue
        yield path, module_name(path)


@pytest.mark.parametrize("layer", ["core", "store", "engine"])
def test_each_layer_imports_only_what_it_may(layer):
    crossing = {}
    for path, module in sources(SERVICE / layer):
        found = faults(module, imports_of(path, module))
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


def test_only_the_engine_imports_the_docker_clients():
    found = {}
    for path, module in sources(SERVICE):
        names = engine_client_imports(module, imports_of(path, module))
        if names:
            found[module] = names
    assert found == {}
    # The reader sees the engine's own imports of them: the rule is not vacuous.
    engine = [imports_of(path, module) for path, module in sources(SERVICE / "engine")]
    assert any("docker" in names for names in engine)


def test_the_spawner_never_imports_the_service():
    found = {}
    for path, module in sources(ROOT / "fgpu_spawner"):
        names = sorted(n for n in imports_of(path, module) if n.split(".")[0] == "queue_service")
        if names:
            found[module] = names
    assert found == {}
    assert list(sources(ROOT / "fgpu_spawner")), "fgpu_spawner/ holds no module"


@pytest.mark.parametrize(
    ("module", "source", "found"),
    [
        ("queue_service.reconciler", "import docker.errors", ["docker.errors"]),
        ("queue_service.private_images", "from docker import errors", ["docker"]),
        ("queue_service.handlers.x", "from dockerspawner import DockerSpawner", ["dockerspawner"]),
        ("queue_service.store.x", "def late():\n    import docker\n", ["docker"]),
        ("queue_service.reconciler", "from .engine.errors import ENGINE_ERRORS", []),
        ("queue_service.engine.x", "import docker.errors\nfrom docker.types import Mount", []),
        ("queue_service.job_files", "import dockerfile_parse", []),
    ],
)
def test_a_docker_client_import_outside_the_engine_is_found(module, source, found):
    assert engine_client_imports(module, imported_modules(source, module)) == found


#: The most lines a module may hold outside its trait declarations (a configurable's settings,
#: each with its help and example, may take what they need).
MODULE_LINES_MAX = 900
PACKAGES = ("queue_service", "fgpu_spawner", "fgpu_shared", "image_catalog", "fgpu_admin")


def trait_declaration_lines(source: str) -> int:
    """Lines of `source` in class-level `name = Trait(..., config=True, ...)` statements."""
    lines = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            value = getattr(statement, "value", None)
            declares = isinstance(statement, ast.Assign) and isinstance(value, ast.Call)
            if declares and any(k.arg == "config" for k in value.keywords):
                lines += statement.end_lineno - statement.lineno + 1
    return lines


def module_lines(path: Path) -> int:
    source = path.read_text()
    return len(source.splitlines()) - trait_declaration_lines(source)


def test_no_module_holds_more_than_its_share_of_lines():
    over = {
        module: lines
        for package in PACKAGES
        for path, module in sources(ROOT / package)
        if (lines := module_lines(path)) > MODULE_LINES_MAX
    }
    assert over == {}


def test_the_counted_lines_leave_out_trait_declarations_only():
    source = (
        "class A:\n"
        "    x = Unicode(\n        'a',\n        config=True,\n    )\n"
        "    y = compute(1)\n"
        "    def f(self):\n        return Unicode('b', config=True)\n"
    )
    assert trait_declaration_lines(source) == 4


def test_outside_the_engine_no_module_names_a_backend():
    """The service asks its backend (engine/backend.py), whichever `engine_class` made it."""
    backends = {"queue_service.engine.docker_engine", "queue_service.engine.swarm_engine"}
    found = {}
    for path, module in sources(SERVICE):
        if layer_of(module) == "engine":
            continue
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        named = sorted(
            {as_module(n) for n in imports_of(path, module)} & backends
            | names & {"DockerEngine", "SwarmEngine"}
        )
        if named:
            found[module] = named
    assert found == {}

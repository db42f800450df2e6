"""The documentation site (docs/source) against the code it describes: the REST API's OpenAPI
file and the service's route table, the environment variables the shipped config reads, and the
generated reference pages (end reasons, metrics)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import yaml
from tornado.web import RequestHandler

from queue_service.core import end_reasons
from queue_service.handlers import routes
from queue_service.store import state_dir

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "source"
OPENAPI = SOURCE / "reference" / "rest-api.yml"
ENVIRONMENT = SOURCE / "reference" / "environment.md"
PREFIX = "/services/queue/"
METHODS = ("get", "head", "post", "put", "patch", "delete", "options")

sys.path.insert(0, str(SOURCE / "_ext"))
import fgpu_docs  # noqa: E402


def handler_methods(handler: type) -> set[str]:
    """The HTTP methods a handler class defines (itself or its bases, tornado's own aside)."""
    found = set()
    for method in METHODS:
        for klass in handler.__mro__:
            if klass is RequestHandler:
                break
            if method in vars(klass):
                found.add(method)
                break
    return found


def openapi_path(pattern: str, names: list[str]) -> str:
    """A tornado route pattern as an OpenAPI path: each regex group becomes the next name."""
    assert pattern.startswith(PREFIX), pattern
    path = "/" + pattern[len(PREFIX) :]
    groups = iter(names)
    path = re.sub(r"\((?:[^()]|\([^()]*\))*\)", lambda _: "{" + next(groups) + "}", path)
    return path


def route_table() -> dict[tuple[str, str], str]:
    """(OpenAPI path with its parameter names taken from the file, method) → the handler."""
    spec = yaml.safe_load(OPENAPI.read_text())
    # The parameter names, in order, of every documented path with the same shape.
    shapes = {re.sub(r"\{[^}]+\}", "{}", path): path for path in spec["paths"]}
    table = {}
    for route in routes(PREFIX):
        pattern, handler = route[0], route[1]
        shape = openapi_path(pattern, ["" for _ in range(pattern.count("("))])
        documented = shapes.get(shape, shape)
        names = re.findall(r"\{([^}]*)\}", documented)
        path = openapi_path(pattern, names) if names else shape
        for method in handler_methods(handler):
            table[(path, method)] = handler.__name__
    return table


def documented_operations() -> set[tuple[str, str]]:
    spec = yaml.safe_load(OPENAPI.read_text())
    return {
        (path, method)
        for path, item in spec["paths"].items()
        for method in METHODS
        if method in item
    }


def test_openapi_file_is_openapi_3_with_a_summary_for_every_operation():
    spec = yaml.safe_load(OPENAPI.read_text())
    assert spec["openapi"].startswith("3.")
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                assert item[method].get("summary"), f"{method.upper()} {path} has no summary"
                assert item[method].get("responses"), f"{method.upper()} {path} has no responses"


def test_every_route_of_the_service_is_in_the_openapi_file():
    missing = sorted(set(route_table()) - documented_operations())
    assert not missing, f"routes the OpenAPI file does not document: {missing}"


def test_every_operation_of_the_openapi_file_is_a_route_of_the_service():
    extra = sorted(documented_operations() - set(route_table()))
    assert not extra, f"operations the service does not serve: {extra}"


def test_path_parameters_are_declared_for_every_templated_path():
    spec = yaml.safe_load(OPENAPI.read_text())
    declared_refs = spec["components"]["parameters"]
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            params = [*item.get("parameters", []), *item[method].get("parameters", [])]
            params = [
                declared_refs[p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p for p in params
            ]
            in_path = {p["name"] for p in params if p["in"] == "path"}
            assert in_path == set(re.findall(r"\{([^}]+)\}", path)), f"{method.upper()} {path}"


def test_route_mapping_turns_groups_into_named_parameters():
    """The comparison above is only as good as this mapping: a group is one parameter."""
    assert (
        openapi_path(PREFIX + r"api/grants/([0-9a-f]+)/(\w+)", ["a", "b"]) == "/api/grants/{a}/{b}"
    )
    assert openapi_path(PREFIX + r"api/nodes/([^/]+)/key", ["h"]) == "/api/nodes/{h}/key"
    assert openapi_path(PREFIX + r"static/(.*)", ["path"]) == "/static/{path}"


def variables_the_config_reads() -> set[str]:
    """Every environment variable named in jupyterhub_config.py (the names it reads with
    os.environ and the ones it passes on), and the database URLs and folders root it reads
    through state_dir."""
    tree = ast.parse((ROOT / "jupyterhub_config.py").read_text())
    names = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+", node.value)
    }
    return names | {state_dir.HUB_DB_ENV, state_dir.QUEUE_DB_ENV, state_dir.FOLDERS_ROOT_ENV}


def variables_documented() -> set[str]:
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", ENVIRONMENT.read_text(), re.M))


def test_every_variable_the_config_reads_is_documented():
    read = variables_the_config_reads()
    assert {"FGPU_HUB_PORT", "FGPU_SIMULATED_GPUS", "FGPU_UNITS_PER_GPU"} <= read
    missing = sorted(read - variables_documented())
    assert not missing, f"variables reference/environment.md does not list: {missing}"


def test_every_documented_variable_is_read_by_the_config():
    extra = sorted(variables_documented() - variables_the_config_reads())
    assert not extra, f"variables listed but never read by jupyterhub_config.py: {extra}"


def test_end_reasons_page_lists_every_code_with_its_label():
    lines = "\n".join(fgpu_docs.EndReasons.lines(None))
    for code, label in end_reasons.LABELS.items():
        assert f"``{code}``" in lines and label in lines


def test_metrics_page_lists_every_family_of_the_metrics_page():
    names = [name for name, _, _ in fgpu_docs.metric_families()]
    assert "fgpu_queue_sessions" in names and "fgpu_gpu_allocated_fgpu" in names
    assert all(help_text for _, help_text, _ in fgpu_docs.metric_families())
    source = (ROOT / "queue_service" / "core" / "metrics.py").read_text()
    assert sorted(names) == sorted(
        set(re.findall(r'"(fgpu_(?:session|gpu|queue)_[a-z_]+)"', source))
    )


def repository_texts() -> dict[str, str]:
    """Every text file Git holds in the repository, as it is in the work tree (this one aside)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    this = str(Path(__file__).relative_to(ROOT))
    texts = {}
    for name in listed:
        path = ROOT / name
        if not name or name == this or not path.is_file():
            continue
        if path.suffix not in {".py", ".md", ".html", ".toml", ".yml", ".yaml", ".sh", ""}:
            continue
        texts[name] = path.read_text(errors="replace")
    return texts


def test_no_reference_to_files_that_left_the_repository():
    """The admin guide moved into the site, and DESIGN.md was never in the repository."""
    stale = [
        name
        for name, text in repository_texts().items()
        if "admin-guide.md" in text or "DESIGN.md" in text
    ]
    assert not stale, stale


def test_doc_paths_cited_in_the_repository_exist():
    """Every `docs/source/....md` a comment, message, script or page names is a page of the site."""
    cited = {
        (name, page)
        for name, text in repository_texts().items()
        for page in re.findall(r"docs/source/[\w/.-]+?\.md", text)
    }
    assert len({page for _, page in cited}) >= 5, "the code cites the site's pages"
    missing = sorted((name, page) for name, page in cited if not (ROOT / page).is_file())
    assert not missing, missing

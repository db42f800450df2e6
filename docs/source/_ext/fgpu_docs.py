"""Reference pages generated from the code, so that they cannot drift from it.

- `fgpu-end-reasons`: the end reasons' codes and labels (`queue_service/core/end_reasons.py`);
- `fgpu-metrics`: the metric families `queue_service/core/metrics.py` renders;
- `fgpu-openapi PATH`: every operation of an OpenAPI 3 file (the REST API's).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList

METHODS = ("get", "head", "post", "put", "patch", "delete")


class _Generated(Directive):
    """A directive whose body is reStructuredText made by `lines()`."""

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self):
        from docutils import nodes

        node = nodes.container()
        source = self.state.document.current_source or "<generated>"
        self.state.nested_parse(StringList(self.lines(), source=source), self.content_offset, node)
        return node.children


def _table(header: list[str], rows: list[list[str]], widths: str = "auto") -> list[str]:
    out = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        out.append(f"   * - {row[0]}")
        out += [f"     - {cell}" for cell in row[1:]]
    return out + [""]


class EndReasons(_Generated):
    def lines(self):
        from queue_service.core import end_reasons

        names = {
            value: name
            for name, value in vars(end_reasons).items()
            if name.isupper() and isinstance(value, str) and value in end_reasons.LABELS
        }
        rows = [
            [f"``{code}``", label, f"``end_reasons.{names[code]}``"]
            for code, label in end_reasons.LABELS.items()
        ]
        return _table(["code (``end_reason``)", "what people read", "constant"], rows)


def metric_families() -> list[tuple[str, str, list[str]]]:
    """(name, help, label names) of every family the metrics page holds, read from a page
    rendered for one running session on one node with one GPU."""
    from queue_service.core import metrics

    usage = {
        "cpu_percent": 1.0,
        "mem_bytes": 1,
        "mem_limit_bytes": 1,
        "gpu_mem_bytes": 1,
        "gpu_util_percent": 1.0,
    }
    session = {
        "id": "1",
        "user": "u",
        "server_name": "",
        "status": "RUNNING",
        "cpu": 1.0,
        "mem": 1,
        "fgpu": 1.0,
        "usage": usage,
    }
    gpu = {"uuid": "GPU-0", "index": 0, "fraction_free": 0.5, "fgpu_free": 1.0}
    page = metrics.render([session], [{"name": "node", "gpus": [gpu]}], 2)
    families: dict[str, list] = {}
    for line in page.splitlines():
        if line.startswith("# HELP "):
            name, help_text = line[len("# HELP ") :].split(" ", 1)
            families[name] = [help_text, []]
        elif line and not line.startswith("#"):
            name, rest = line.split("{", 1)
            labels = [pair.split("=", 1)[0] for pair in rest.split("}", 1)[0].split(",")]
            families[name][1] = labels
    return [(name, help_text, labels) for name, (help_text, labels) in families.items()]


class Metrics(_Generated):
    def lines(self):
        rows = [
            [f"``{name}``", help_text, ", ".join(f"``{label}``" for label in labels)]
            for name, help_text, labels in metric_families()
        ]
        return _table(["metric (gauge)", "meaning", "labels"], rows)


class OpenAPI(_Generated):
    required_arguments = 1

    def lines(self):
        env = self.state.document.settings.env
        _, path = env.relfn2path(self.arguments[0], env.docname)
        env.note_dependency(path)
        spec = yaml.safe_load(Path(path).read_text())
        refs = spec.get("components", {}).get("parameters", {})

        def resolve(param):
            if "$ref" in param:
                return refs[param["$ref"].rsplit("/", 1)[1]]
            return param

        out: list[str] = []
        for route, item in spec["paths"].items():
            shared = [resolve(p) for p in item.get("parameters", [])]
            for method in METHODS:
                if method not in item:
                    continue
                op = item[method]
                out += [
                    f".. rubric:: ``{method.upper()} {route}``",
                    "   :heading-level: 3",
                    "",
                    op.get("summary", "") + ".",
                    "",
                ]
                if op.get("description"):
                    out += [*op["description"].strip().splitlines(), ""]
                params = shared + [resolve(p) for p in op.get("parameters", [])]
                for param in params:
                    where = "path" if param["in"] == "path" else param["in"]
                    text = param.get("description", "")
                    out.append(f"- ``{param['name']}`` ({where}) {text}".rstrip())
                if params:
                    out.append("")
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                if body:
                    keys = body["schema"].get("properties", {})
                    out += ["Body (JSON): " + ", ".join(f"``{key}``" for key in keys), ""]
                codes = ", ".join(str(code) for code in op.get("responses", {}))
                out += [f"Answers: {codes}.", ""]
        return out


OWN_PACKAGES = (
    "fgpu_spawner",
    "queue_service",
    "image_catalog",
    "fgpu_admin",
    "node_agent",
    "fgpu_shared",
)


_documenting: dict[str, type] = {}


def note_class(app, what, name, obj, options, signature, return_annotation):
    """Which configurable class autodoc is documenting: its members are gathered next."""
    if isinstance(obj, type):
        _documenting["class"] = obj


def _own_trait(obj) -> bool:
    """A trait defined by one of this repository's classes (not DockerSpawner's, say)."""
    owner = getattr(obj, "this_class", None)
    return owner is not None and owner.__module__.split(".")[0] in OWN_PACKAGES


def skip_inherited_traits(app, what, name, obj, skip, options):
    """A configurable class's reference lists the traits it defines; the ones it inherits are
    documented with the class that defines them (DockerSpawner's and JupyterHub's there)."""
    from traitlets import TraitType

    if isinstance(obj, TraitType):
        documented = _documenting.get("class")
        return not _own_trait(obj) or (documented is not None and obj.this_class is not documented)
    return None


def help_as_rst(app, what, name, obj, options, lines):
    """A trait's help is plain text in the code (`--help-all` prints it): its indented blocks
    (the `c.Class.trait = ...` examples) become code blocks here. A block after a line ending
    in `::` (`Example::`) is a literal block already, highlighted as Python by Sphinx."""
    from traitlets import TraitType

    if not (isinstance(obj, TraitType) and _own_trait(obj)):
        return
    text = [line for line in lines if line.strip()]
    base = min((len(line) - len(line.lstrip()) for line in text), default=0)
    out: list[str] = []
    in_code = False
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent > base and not in_code and (not out or not out[-1].strip()):
            said = [previous for previous in out if previous.strip()]
            if not (said and said[-1].rstrip().endswith("::")):
                out += [" " * base + ".. code-block:: python", ""]
            in_code = True
        elif line.strip() and indent <= base:
            if in_code and out and out[-1].strip():
                out.append("")
            in_code = False
        out.append(line)
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-signature", note_class)
    app.connect("autodoc-skip-member", skip_inherited_traits)
    app.connect("autodoc-process-docstring", help_as_rst)
    app.add_directive("fgpu-end-reasons", EndReasons)
    app.add_directive("fgpu-metrics", Metrics)
    app.add_directive("fgpu-openapi", OpenAPI)
    return {"parallel_read_safe": False, "parallel_write_safe": True}

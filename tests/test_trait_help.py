"""Every configurable trait's help ends with an example a site can copy, as KubeSpawner's do:
an `Example::` literal block that sets `c.<Class>.<trait>`, valid Python, with a
value other than the default. The reference page (docs/source/reference/configuration.md)
renders these helps as reStructuredText."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest
from traitlets import Dict, Float, HasTraits, Integer, TraitType, Unicode
from traitlets.config import LoggingConfigurable

from fgpu_shared import site_config
from fgpu_spawner import FGPUSpawner, FGPUSwarmSpawner
from fgpu_spawner.demo_login import DemoAuthenticator
from fgpu_spawner.lti_login import LTICourseAuthenticator
from queue_service.app import QueueService
from queue_service.engine.backend import EngineBackend
from queue_service.engine.docker_engine import DockerEngine
from queue_service.engine.swarm_engine import SwarmEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "source" / "_ext"))
import fgpu_docs  # noqa: E402

CONFIGURABLES = (
    FGPUSpawner,
    FGPUSwarmSpawner,
    DemoAuthenticator,
    LTICourseAuthenticator,
    QueueService,
    EngineBackend,
    DockerEngine,
    SwarmEngine,
)


def own_config_traits(cls: type) -> dict[str, TraitType]:
    """The `config=True` traits `cls` defines itself (inherited ones are checked with theirs)."""
    return {
        name: trait
        for name, trait in cls.class_traits(config=True).items()
        if trait.this_class is cls
    }


def examples(help_text: str) -> list[str]:
    """The literal blocks of a help that follow a line ending in `Example::`, dedented."""
    lines = textwrap.dedent(help_text).splitlines()
    found = []
    for i, line in enumerate(lines):
        if not line.strip().endswith("Example::"):
            continue
        base = len(line) - len(line.lstrip())
        block = []
        for following in lines[i + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= base:
                break
            block.append(following)
        found.append(textwrap.dedent("\n".join(block)).strip())
    return found


def sets(tree: ast.AST, cls: str, name: str) -> list[ast.expr]:
    """The values `tree` assigns to `c.<cls>.<name>`."""
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and target.attr == name
        and isinstance(target.value, ast.Attribute)
        and target.value.attr == cls
        and isinstance(target.value.value, ast.Name)
        and target.value.value.id == "c"
    ]


def line_setting(cls: str, name: str, code: str) -> tuple[str, str]:
    """The (section, trait) an example of `cls.name` sets: its own, or for a service setting
    whose one source is the spawner's (fgpu_shared/site_config.py), the spawner's line."""
    if cls != site_config.SERVICE:
        return cls, name
    if name in site_config.SHARED:
        return next(
            ((s, name) for s in site_config.SHARED[name] if f"c.{s}.{name} = " in code),
            (site_config.SHARED[name][0], name),
        )
    if name == "session_limits":
        return next(
            (
                ("FGPUSpawner", key)
                for key in site_config.LIMITS
                if f"c.FGPUSpawner.{key} = " in code
            ),
            ("FGPUSpawner", "fgpu_max"),
        )
    return cls, name


def settings_holder(cls: type):
    """An instance to check `cls`'s settings on: an engine backend's is made without the engine
    client and service hooks it runs with (its settings need neither), the abstract base's as
    the shipped Docker engine."""
    if not issubclass(cls, EngineBackend):
        return cls()
    concrete = DockerEngine if cls is EngineBackend else cls
    instance = concrete.__new__(concrete)
    LoggingConfigurable.__init__(instance)
    return instance


def problems(cls: type) -> list[str]:
    """What is wrong with the examples of `cls`'s own configurable traits."""
    found = []
    instance = settings_holder(cls)
    for name, trait in own_config_traits(cls).items():
        where = f"{cls.__name__}.{name}"
        blocks = examples(trait.help)
        if not blocks:
            found.append(f"{where}: no 'Example::' block in its help")
            continue
        code = blocks[-1]
        section, set_name = line_setting(cls.__name__, name, code)
        if f"c.{section}.{set_name} = " not in code:
            found.append(f"{where}: its example does not set c.{section}.{set_name}")
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            found.append(f"{where}: its example is not Python ({e})")
            continue
        values = sets(tree, section, set_name)
        if not values:
            found.append(f"{where}: its example does not assign c.{section}.{set_name}")
            continue
        if (section, set_name) != (cls.__name__, name):
            continue  # the spawner's line: its trait judges the value (tested on a hub)
        try:
            value = ast.literal_eval(values[0])
        except ValueError:
            continue  # an expression (a file read, a dict built on another): not comparable
        try:
            value = trait.validate(instance, value)
        except Exception as e:  # noqa: BLE001 (any refusal of the value is the finding)
            found.append(f"{where}: the trait refuses its example's value ({e})")
            continue
        if value == getattr(instance, name):
            found.append(f"{where}: its example only repeats the default {value!r}")
    return found


def config_traits_in_the_source() -> set[tuple[str, str]]:
    """(class, trait) of every `config=True` trait the repository's packages define."""
    found = set()
    for package in fgpu_docs.OWN_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for klass in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                for node in klass.body:
                    if (
                        isinstance(node, ast.Assign)
                        and isinstance(node.value, ast.Call)
                        and any(
                            k.arg == "config"
                            and isinstance(k.value, ast.Constant)
                            and k.value.value is True
                            for k in node.value.keywords
                        )
                    ):
                        found |= {(klass.name, t.id) for t in node.targets}
    return found


def test_every_configurable_class_of_the_repository_is_checked():
    in_source = config_traits_in_the_source()
    checked = {(cls.__name__, name) for cls in CONFIGURABLES for name in own_config_traits(cls)}
    assert len(in_source) >= 90
    assert in_source == checked


@pytest.mark.parametrize("cls", CONFIGURABLES, ids=lambda cls: cls.__name__)
def test_every_config_trait_help_ends_with_a_python_example(cls):
    assert own_config_traits(cls)
    assert problems(cls) == []


class Careless(HasTraits):
    """Helps as they must not be: the check above must find each."""

    no_example = Integer(1, config=True, help="""A number.""")
    not_python = Unicode(
        "",
        config=True,
        help="""
        A name.

        Example::

            c.Careless.not_python = "unclosed
        """,
    )
    other_trait = Float(
        1.0,
        config=True,
        help="""
        A time.

        Example::

            c.Careless.no_example = 2.0
        """,
    )
    the_default = Dict(
        {"a": 1},
        config=True,
        help="""
        A mapping.

        Example::

            c.Careless.the_default = {"a": 1}
        """,
    )
    wrong_type = Integer(
        1,
        config=True,
        help="""
        A count.

        Example::

            c.Careless.wrong_type = "many"
        """,
    )
    fine = Integer(
        1,
        config=True,
        help="""
        A count.

        Example::

            c.Careless.fine = 3
        """,
    )


def test_the_check_finds_each_kind_of_bad_example():
    found = problems(Careless)
    assert [line.split(":")[0] for line in found] == [
        "Careless.no_example",
        "Careless.not_python",
        "Careless.other_trait",
        "Careless.the_default",
        "Careless.wrong_type",
    ], found


def test_examples_render_as_literal_blocks_not_as_a_second_code_block():
    """`Example::` opens the literal block itself: the docs' help filter adds no code-block
    directive after it (which Sphinx would take for an empty literal block, a warning)."""
    trait = EngineBackend.class_traits()["reserve_cpu"]
    lines = textwrap.dedent(trait.help).splitlines()
    fgpu_docs.help_as_rst(None, "attribute", "reserve_cpu", trait, {}, lines)
    assert not any("code-block" in line for line in lines), lines
    assert "Example::" in lines and "    c.EngineBackend.reserve_cpu = 2" in lines

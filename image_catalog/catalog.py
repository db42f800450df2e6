"""Catalog schema and validation: `catalog.yaml` → `Catalog` of `CatalogImage` entries.

Validation happens once, when the file is loaded, so that a bad catalog stops the hub at start-up
with a message that names the entry and the field, instead of failing a student's spawn later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .resources import ImageResources, ResourceError, parse_resources

DEFAULT_CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
RECIPES_DIR = Path(__file__).with_name("recipes")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# Docker's reference grammar, reduced to what a local, registry-less engine needs.
_REFERENCE_RE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$"
)
_ALLOWED_KEYS = {
    "name",
    "display_name",
    "image",
    "framework",
    "version",
    "description",
    "gpu",
    "prebuild",
    "wheels",
    "hidden",
    "recipe",
    "base",
    "build_args",
    "groups",
    "resources",
    "owner",
}
#: What an instructor may set through the service's API (recipes belong to the shipped file).
API_KEYS = _ALLOWED_KEYS - {"recipe", "base", "build_args"}


class CatalogError(ValueError):
    """The catalog file, or an entry in it, is not valid."""


@dataclass(frozen=True)
class CatalogImage:
    """One entry of the catalog: a Docker image that can start a single-user server."""

    name: str
    display_name: str
    image: str
    framework: str = ""
    version: str = ""
    description: str = ""
    gpu: bool = False
    hidden: bool = False
    #: Built by `build --all` (setup, CI); heavy images (PyTorch, TensorFlow) are built by name.
    prebuild: bool = True
    #: File-name patterns of wheels the recipe takes from the local wheel folder (FGPU_WHEEL_DIR).
    wheels: tuple[str, ...] = ()
    recipe: str | None = None
    base: str | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    #: Hub groups that may use the image; empty means everyone.
    groups: tuple[str, ...] = ()
    resources: ImageResources = field(default_factory=ImageResources)
    #: The one user a private image belongs to (a committed session); None for shared images.
    owner: str | None = None

    def to_dict(self) -> dict:
        """The fields an API or the DB stores (recipes stay in the shipped file)."""
        return {
            "name": self.name,
            "display_name": self.display_name,
            "image": self.image,
            "framework": self.framework,
            "version": self.version,
            "description": self.description,
            "gpu": self.gpu,
            "hidden": self.hidden,
            "groups": list(self.groups),
            "resources": self.resources.to_dict(),
            "owner": self.owner,
        }


@dataclass(frozen=True)
class Catalog:
    """An ordered, validated set of images, looked up by name."""

    images: tuple[CatalogImage, ...]

    def get(self, name: str) -> CatalogImage:
        for image in self.images:
            if image.name == name:
                return image
        raise KeyError(name)

    def names(self) -> list[str]:
        return [image.name for image in self.images]

    def visible(self) -> list[CatalogImage]:
        return [image for image in self.images if not image.hidden]


def is_valid_reference(reference: str) -> bool:
    return bool(_REFERENCE_RE.match(reference))


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog file (the shipped one by default)."""
    path = Path(path) if path else DEFAULT_CATALOG_PATH
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CatalogError(f"cannot read image catalog {path}: {e}") from e
    return parse_catalog(data, source=str(path))


def parse_catalog(data: object, source: str = "catalog") -> Catalog:
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise CatalogError(f"{source}: expected a mapping with an 'images' list")
    images = tuple(
        _parse_entry(entry, f"{source}: images[{i}]") for i, entry in enumerate(data["images"])
    )
    _check_cross_references(images, source)
    return Catalog(images)


def parse_image(entry: object, where: str = "image", allowed: set[str] = API_KEYS) -> CatalogImage:
    """One entry, as the API receives it: the same checks as the file's, without recipes."""
    return _parse_entry(entry, where, allowed)


def _parse_entry(entry: object, where: str, allowed: set[str] = _ALLOWED_KEYS) -> CatalogImage:
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: expected a mapping")
    unknown = set(entry) - allowed
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for required in ("name", "image"):
        if not isinstance(entry.get(required), str) or not entry[required]:
            raise CatalogError(f"{where}: '{required}' is required and must be a string")
    name, reference = entry["name"], entry["image"]
    if not _NAME_RE.match(name):
        raise CatalogError(
            f"{where}: name {name!r} must be lower-case letters, digits, '.', '_' or '-'"
        )
    if not is_valid_reference(reference):
        raise CatalogError(f"{where} ({name}): {reference!r} is not a valid image reference")
    try:
        resources = parse_resources(entry.get("resources"))
    except ResourceError as e:
        raise CatalogError(f"{where} ({name}): {e}") from None
    build_args = entry.get("build_args") or {}
    if not isinstance(build_args, dict):
        raise CatalogError(f"{where} ({name}): build_args must be a mapping")
    return CatalogImage(
        name=name,
        display_name=str(entry.get("display_name") or name),
        image=reference,
        framework=str(entry.get("framework") or ""),
        version=str(entry.get("version") or ""),
        description=str(entry.get("description") or ""),
        gpu=_flag(entry, "gpu", f"{where} ({name})"),
        hidden=_flag(entry, "hidden", f"{where} ({name})"),
        recipe=entry.get("recipe"),
        prebuild=bool(entry.get("prebuild", True)),
        wheels=_parse_wheels(entry.get("wheels"), f"{where} ({name})"),
        base=entry.get("base"),
        build_args={str(k): str(v) for k, v in build_args.items()},
        groups=_parse_groups(entry.get("groups"), f"{where} ({name})"),
        resources=resources,
        owner=_parse_owner(entry.get("owner"), f"{where} ({name})"),
    )


def _flag(entry: dict, key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise CatalogError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def _parse_groups(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(g, str) and g for g in value):
        raise CatalogError(f"{where}: groups must be a list of hub group names")
    return tuple(dict.fromkeys(g.strip() for g in value))


def _parse_owner(value: object, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise CatalogError(f"{where}: owner must be a user name")
    return value


def _parse_wheels(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CatalogError(f"{where}: wheels must be a list of wheel file-name patterns")
    if any("/" in v for v in value):
        raise CatalogError(f"{where}: wheels are file names in the wheel folder, not paths")
    return tuple(value)


def _check_cross_references(images: tuple[CatalogImage, ...], source: str) -> None:
    seen: set[str] = set()
    for image in images:
        if image.name in seen:
            raise CatalogError(f"{source}: duplicate image name {image.name!r}")
        seen.add(image.name)
    for image in images:
        if image.base is not None and image.base not in seen:
            raise CatalogError(f"{source}: {image.name}: base {image.base!r} is not in the catalog")
        if image.recipe is not None and not (RECIPES_DIR / image.recipe / "Dockerfile").is_file():
            raise CatalogError(f"{source}: {image.name}: recipe {image.recipe!r} has no Dockerfile")
    if not any(not image.hidden for image in images):
        raise CatalogError(f"{source}: at least one image must be visible")

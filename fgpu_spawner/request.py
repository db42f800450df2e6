"""`user_options` → `ResourceRequest`: parsing and validation, with no I/O.

The form and `POST /hub/api/users/{name}/servers/{server}` send the same keys (docs/source/explanation/contracts.md, contract 3),
so one parser serves both. Every refusal raises `InvalidRequest` with a sentence a student can act on.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from fgpu_shared.units import format_size, parse_amount, parse_positive_size
from image_catalog import Catalog
from image_catalog.job_options import JobOptionError, check_job
from image_catalog.launch_options import (
    LAUNCH_OPTIONS,
    OptionError,
    check_env,
    check_folders,
    check_name,
    resolve_preset,
    with_defaults,
)
from image_catalog.unicode_text import surrogate_at, surrogate_message

KNOWN_OPTIONS = (*LAUNCH_OPTIONS, "request_key")
_REQUEST_KEY_RE = re.compile(r"[0-9a-f]{32}")


class InvalidRequest(ValueError):
    """The user's options cannot be granted as they are; the message says why."""


@dataclass(frozen=True)
class Range:
    """Allowed values for one slot, with the value used when the user gives none."""

    min: float
    max: float
    default: float

    def check(self, label: str, value: float, show=lambda v: f"{v:g}") -> None:
        if value < self.min:
            raise InvalidRequest(f"{label} must be at least {show(self.min)}, not {show(value)}.")
        if value > self.max:
            raise InvalidRequest(
                f"{label} is limited to {show(self.max)}; {show(value)} was asked."
            )


@dataclass(frozen=True)
class RequestLimits:
    """What a single session may ask for (site policy, from the spawner's config)."""

    cpu: Range
    mem: Range
    fgpu: Range
    default_image: str | None = None

    def defaults(self) -> dict:
        """The defaults as launch_options.with_defaults reads them (SESSION_LIMITS' keys)."""
        return {
            "cpu_default": self.cpu.default,
            "mem_default": self.mem.default,
            "default_image_name": self.default_image or "",
        }


@dataclass(frozen=True)
class ResourceRequest:
    """A validated request for one session: which image, and how big a slice."""

    image_name: str
    image: str
    cpu: float
    mem: int
    fgpu: float = 0.0
    #: None lets the queue place the session in any resource group the user may use.
    resource_group: str | None = None
    #: The queue record this start is for, when the queue service recorded it first (a launch of
    #: several sessions); None: the spawner picks a new key. The queue gives the record only to
    #: a request of the same user, server and slots.
    request_key: str | None = None
    #: The session's own environment variables (checked: launch_options.check_env), as pairs.
    env: tuple[tuple[str, str], ...] = ()
    #: Storage folders to mount, by id or name (the queue service resolves and checks them).
    folders: tuple[str, ...] = ()
    #: A batch job's canonical JSON (image_catalog/job_options.py); None: an interactive session.
    job: str | None = None

    @property
    def batch(self) -> bool:
        return self.job is not None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_request(
    options: dict,
    limits: RequestLimits,
    catalog: Catalog,
    presets: list[dict] | None = None,
    server_name: str = "",
) -> ResourceRequest:
    """Validate `options` against the limits and the catalog, or raise InvalidRequest.

    `presets`: the presets offered to this user, as `GET api/presets` lists them; a `preset`
    option stands for its slots, which then meet the same limits as slots given one by one.
    `server_name`: the server being started; a `name` option, when given, must be it (a
    session's name is its server's name, which the hub's URL already carries).

    What a launch leaves out takes the user's default, one rule for the form, the hub's REST API
    and the admin panel's Start button (which sends no options at all): no `image`, the user's
    default image; no slots, the smallest preset the user may use now that holds no GPU, or
    else the image's and the hub's defaults, and no GPU (launch_options.with_defaults)."""
    if not isinstance(options, dict):
        raise InvalidRequest("Options must be a JSON object.")
    bad = surrogate_at(options)
    if bad is not None:  # the container's env and command line could not hold it
        raise InvalidRequest(surrogate_message(bad))
    unknown = sorted(set(options) - set(KNOWN_OPTIONS))
    if unknown:
        raise InvalidRequest(
            f"Unknown option(s): {', '.join(unknown)}. Known options: {', '.join(KNOWN_OPTIONS)}."
        )
    options = with_defaults(options, catalog.visible(), presets or [], limits.defaults())
    try:
        options = resolve_preset(options, presets or [])
        _check_name(options.get("name"), server_name)
        env = tuple(sorted(check_env(options.get("env")).items()))
        folders = check_folders(options.get("folders"))
        job = check_job(options)
    except (OptionError, JobOptionError) as e:
        raise InvalidRequest(str(e)) from None
    image = _parse_image(options.get("image"), catalog)
    # The image's own defaults first (a big framework may want more memory), then the site's.
    defaults = image.resources.default
    cpu = _parse_number("cpu", options.get("cpu"), _first(defaults.cpu, limits.cpu.default))
    mem = _parse_mem(options.get("mem"), int(_first(defaults.mem, limits.mem.default)))
    fgpu = _parse_number(
        "fgpu", options.get("fgpu"), _first(defaults.fgpu, limits.fgpu.default), zero_ok=True
    )
    limits.cpu.check("CPU", cpu, show=lambda v: f"{v:g} cores")
    limits.mem.check("Memory", mem, show=lambda v: format_size(int(v)))
    _check_fgpu(fgpu, limits.fgpu)
    shortfall = image.resources.shortfall(cpu, mem, fgpu)
    if shortfall:
        raise InvalidRequest(f"Image {image.name!r} {shortfall}.")
    group = _parse_resource_group(options.get("resource_group"))
    key = _parse_request_key(options.get("request_key"))
    return ResourceRequest(image.name, image.image, cpu, mem, fgpu, group, key, env, folders, job)


def _check_name(value: object, server_name: str) -> None:
    name = check_name(value)
    if name is not None and name != server_name:
        where = f"server {server_name!r}" if server_name else "the default server"
        raise InvalidRequest(
            f"name {name!r} differs from {where}: a session's name is its server's name; start "
            f"server {name!r} instead, or leave out name."
        )


def _is_blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _first(value, fallback):
    return fallback if value is None else value


def _parse_image(value: object, catalog: Catalog):
    """The named image, if this user may start it (none named: `with_defaults` found none)."""
    visible = catalog.visible()
    if not visible:
        raise InvalidRequest("No image is offered to you yet; ask your instructor.")
    choices = ", ".join(image.name for image in visible)
    if _is_blank(value):
        raise InvalidRequest(f"A launch names its image (a catalog name): one of {choices}.")
    if not isinstance(value, str):
        raise InvalidRequest(f"image must be a catalog name, not {value!r}.")
    try:
        image = catalog.get(value)
    except KeyError:
        raise InvalidRequest(f"Unknown image {value!r}. Available images: {choices}.") from None
    if image.hidden:
        raise InvalidRequest(f"Image {value!r} is not offered. Available images: {choices}.")
    return image


def _parse_number(name: str, value: object, default: float, zero_ok: bool = False) -> float:
    if _is_blank(value):
        return float(default)
    try:
        return parse_amount(value, zero_ok)
    except ValueError as e:
        raise InvalidRequest(f"{name} {e}.") from None


def _parse_mem(value: object, default: int) -> int:
    if _is_blank(value):
        return default
    try:
        return parse_positive_size(value)
    except ValueError as e:
        raise InvalidRequest(f"mem: {e}.") from None


def _check_fgpu(fgpu: float, allowed: Range) -> None:
    if fgpu > 0 and allowed.max <= 0:
        raise InvalidRequest("This hub offers no fGPU; ask for fgpu=0.")
    if fgpu > 0:
        allowed.check("fGPU", fgpu)


def _parse_resource_group(value: object) -> str | None:
    """A name, checked by the queue service, which knows the resource groups and who may use
    which; blank means any the user may use."""
    if _is_blank(value):
        return None
    if not isinstance(value, str):
        raise InvalidRequest("resource_group must be the name of a resource group.")
    return value.strip()


def _parse_request_key(value: object) -> str | None:
    """The key of a queue record made for this start: 32 lowercase hex digits (a uuid4's hex)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _REQUEST_KEY_RE.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise InvalidRequest(f"request_key must be 32 lowercase hex digits, not {shown}.")
    return value

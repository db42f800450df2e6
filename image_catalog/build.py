"""Offline image builder: catalog entries → local Docker images, with no registry anywhere.

The chain is built bottom-up:

1. **Root filesystem.** ``debootstrap --variant=minbase bookworm`` from the host's own Debian mirror
   (read from its apt sources, never written into the repository), tar'd into ``$FGPU_CACHE_DIR``
   and ``docker import``-ed as ``fgpu/rootfs:bookworm-<hash>``. The hash covers the package list,
   so a changed list gets a new tar and a new image while an unchanged one is never re-fetched.
2. **Catalog entries**, bases first. Each recipe folder under ``recipes/`` is built with the
   engine's legacy builder (BuildKit is not available here) from a temporary context that also
   carries the host's extra CA certificates, with ``BASE_IMAGE`` pointing at the entry's base (or
   at the root filesystem) and ``JUPYTERHUB_VERSION`` at the hub's own version.
3. **Idempotence.** Every image is labelled ``fgpu.recipe-hash``: a hash over the build context,
   the build arguments and the base image's id. A re-run finds the label unchanged and skips the
   build, so it takes about a second; a changed recipe, argument or base rebuilds exactly what
   depends on it.

The pure helpers (parsing apt sources, ordering, hashing, arguments and labels) do no I/O and are
unit-tested without Docker; the functions below the "I/O" line talk to the file system, to
debootstrap and to the Docker engine.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from image_catalog import labextension

from .catalog import RECIPES_DIR, Catalog, CatalogImage, load_catalog

Log = Callable[[str], None]

SUITE = "bookworm"
DEBOOTSTRAP_VARIANT = "minbase"
ROOTFS_PACKAGES = (
    "python3",
    "python3-venv",
    "ca-certificates",
    "tini",
    "procps",
    "less",
    "vim-tiny",
    "curl",
    # nbgitpuller's material links pull a course's repository into the home with git.
    "git",
)
# Removed from the root filesystem before it is tar'd: apt's downloaded .debs and package lists
# (about 100 MB that `apt-get update` recreates), manuals and message translations.
ROOTFS_TRIM_GLOBS = (
    "var/cache/apt/archives/*.deb",
    "var/lib/apt/lists/*_*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*/LC_MESSAGES",
)
ROOTFS_REPOSITORY = "fgpu/rootfs"

DEFAULT_CACHE_DIR = "/var/cache/fgpu-hub"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
CA_CONTEXT_DIR = "ca"
# Wheels that PyPI does not carry (PyTorch's CPU builds live on download.pytorch.org, which this
# network cannot reach) come from a local folder; recipes find them in the context's wheels/.
DEFAULT_WHEEL_DIR = "/opt/wheels"
WHEEL_CONTEXT_DIR = "wheels"
APT_SOURCES_FILES = ("/etc/apt/sources.list",)
APT_SOURCES_DIR = "/etc/apt/sources.list.d"
MIRROR_SCHEMES = ("http://", "https://", "file:/")

LABEL_RECIPE_HASH = "fgpu.recipe-hash"
LABEL_CATALOG_NAME = "fgpu.catalog-name"
LABEL_FRAMEWORK = "fgpu.framework"
LABEL_VERSION = "fgpu.version"

LOG_TAIL_LINES = 25
# The engine colours a RUN step's stderr; the escapes only garble log files and error messages.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class BuildError(RuntimeError):
    """An image could not be built; the message says which and why."""


class UnknownImageError(BuildError):
    """A name that is not in the catalog was asked for."""


# ---------------------------------------------------------------------------------------------
# Pure helpers: no I/O.
# ---------------------------------------------------------------------------------------------


def parse_deb822_sources(text: str, suite: str = SUITE) -> list[str]:
    """URIs of the enabled ``deb`` stanzas of a ``.sources`` file that list ``suite``."""
    uris = []
    for stanza in _deb822_stanzas(text):
        if stanza.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        if suite not in stanza.get("suites", "").split():
            continue
        uris.extend(uri for uri in stanza.get("uris", "").split() if _is_mirror_uri(uri))
    return uris


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    # Stanzas are separated by blank lines; a line starting with whitespace continues the field
    # above it; '#' lines are comments (Debian puts one between URIs and Suites, for example).
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line.lstrip().startswith("#"):
            continue
        elif line[0] in " \t" and key is not None:
            current[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            current[key] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def parse_one_line_sources(text: str, suite: str = SUITE) -> list[str]:
    """URIs of the ``deb URI suite components...`` lines of a ``sources.list`` that name ``suite``."""
    uris = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):
            # Options such as [arch=amd64 signed-by=...] may span several words.
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2 and words[1] == suite and _is_mirror_uri(words[0]):
            uris.append(words[0])
    return uris


def _is_mirror_uri(uri: str) -> bool:
    # debootstrap fetches over http(s) or from a local path; skip cdrom:, mirror+file: and the like.
    return uri.startswith(MIRROR_SCHEMES)


def find_debian_mirror(sources: Mapping[str, str], suite: str = SUITE) -> str:
    """The first mirror for ``suite`` in ``{path: text}`` of apt source files.

    ``.sources`` files are read as deb822, ``.list`` files (and ``sources.list``) as one-line
    entries, as apt itself does; other files are ignored.
    """
    for path, text in sources.items():
        if path.endswith(".sources"):
            uris = parse_deb822_sources(text, suite)
        elif path.endswith(".list"):
            uris = parse_one_line_sources(text, suite)
        else:
            continue
        if uris:
            return uris[0].rstrip("/")
    searched = ", ".join(sources) or "no apt source files"
    raise BuildError(
        f"no Debian mirror for '{suite}' found in the apt sources ({searched}); "
        f"set FGPU_DEBIAN_MIRROR to the mirror URL to use"
    )


def rootfs_hash(
    packages: Iterable[str] = ROOTFS_PACKAGES,
    suite: str = SUITE,
    variant: str = DEBOOTSTRAP_VARIANT,
    trim: Iterable[str] = ROOTFS_TRIM_GLOBS,
) -> str:
    """A short hash naming the root filesystem that these inputs produce (its tar and its image)."""
    spec = {"suite": suite, "variant": variant, "packages": sorted(packages), "trim": list(trim)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def rootfs_reference(digest: str, suite: str = SUITE) -> str:
    return f"{ROOTFS_REPOSITORY}:{suite}-{digest}"


def debootstrap_command(
    target: str, mirror: str, packages: Iterable[str] = ROOTFS_PACKAGES, suite: str = SUITE
) -> list[str]:
    return [
        "debootstrap",
        f"--variant={DEBOOTSTRAP_VARIANT}",
        "--include=" + ",".join(packages),
        suite,
        target,
        mirror,
    ]


def build_order(catalog: Catalog, names: Iterable[str] | None = None) -> list[CatalogImage]:
    """The entries to process, every base before the images built on it.

    ``names=None`` means every entry that has a recipe and is marked ``prebuild`` (heavy images
    such as PyTorch or TensorFlow are built by name only). Bases are pulled in even when not asked
    for, and the catalog's own order is kept among entries that do not depend on each other.
    """
    known = {image.name: image for image in catalog.images}
    if names is None:
        wanted = [image.name for image in catalog.images if image.recipe and image.prebuild]
    else:
        wanted = list(dict.fromkeys(names))
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise UnknownImageError(
                f"unknown image name(s): {', '.join(unknown)}; "
                f"the catalog has: {', '.join(catalog.names())}"
            )
    order: list[CatalogImage] = []
    done: set[str] = set()
    for name in wanted:
        _visit(name, known, done, order, chain=())
    return order


def _visit(name, known, done, order, chain):
    if name in done:
        return
    if name in chain:
        loop = " -> ".join((*chain, name))
        raise BuildError(f"the catalog's bases form a loop: {loop}")
    image = known[name]
    if image.base:
        _visit(image.base, known, done, order, (*chain, name))
    done.add(name)
    order.append(image)


def heavy_names(catalog: Catalog) -> list[str]:
    """The entries the hub builds behind itself: a recipe, left out of ``build --all``
    (``prebuild: false``), and offered (a hidden heavy entry, such as PyTorch's CUDA build, is
    built by name only, by an admin who wants it)."""
    return [i.name for i in catalog.images if i.recipe and not i.prebuild and not i.hidden]


def build_args_for(image: CatalogImage, base_image: str, jupyterhub_version: str) -> dict[str, str]:
    """The entry's own build arguments plus the two every recipe relies on (which win)."""
    return {
        **image.build_args,
        "BASE_IMAGE": base_image,
        "JUPYTERHUB_VERSION": jupyterhub_version,
    }


def recipe_hash(
    files: Mapping[str, bytes], build_args: Mapping[str, str], base_image_id: str
) -> str:
    """sha256 over everything that decides the image: context files, arguments, base image id."""
    spec = {
        "files": {path: hashlib.sha256(files[path]).hexdigest() for path in sorted(files)},
        "build_args": dict(sorted(build_args.items())),
        "base_image_id": base_image_id,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def image_labels(image: CatalogImage, digest: str) -> dict[str, str]:
    return {
        LABEL_RECIPE_HASH: digest,
        LABEL_CATALOG_NAME: image.name,
        LABEL_FRAMEWORK: image.framework,
        LABEL_VERSION: image.version,
    }


def select_wheels(image: CatalogImage, available: Iterable[str], wheel_dir: str) -> list[str]:
    """The files of ``available`` (names in ``wheel_dir``) that the entry's ``wheels`` patterns
    match, newest name last; a pattern that matches nothing is a clear error before any build."""
    names = sorted(available)
    chosen: list[str] = []
    for pattern in image.wheels:
        matches = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise BuildError(
                f"{image.name}: no wheel matching {pattern!r} in {wheel_dir}; put it there or "
                f"point FGPU_WHEEL_DIR at the folder that holds it"
            )
        chosen += [name for name in matches if name not in chosen]
    return chosen


def failure_message(what: str, reason: str, tail: Iterable[str]) -> str:
    lines = list(tail)
    text = f"{what} failed: {reason.strip()}"
    if lines:
        text += f"\n--- last {len(lines)} log lines ---\n" + "\n".join(lines)
    return text


# ---------------------------------------------------------------------------------------------
# I/O: files, debootstrap, the Docker engine.
# ---------------------------------------------------------------------------------------------


def read_apt_sources() -> dict[str, str]:
    """``{path: text}`` of the host's apt source files, sources.list first, as apt reads them."""
    paths = [Path(p) for p in APT_SOURCES_FILES]
    source_dir = Path(APT_SOURCES_DIR)
    if source_dir.is_dir():
        paths += sorted(source_dir.iterdir())
    sources = {}
    for path in paths:
        if path.is_file() and path.name.endswith((".list", ".sources")):
            sources[str(path)] = path.read_text(errors="replace")
    return sources


def debian_mirror() -> str:
    # An explicit setting wins: a machine whose apt uses a proxy scheme or a CD has no usable URI.
    return os.environ.get("FGPU_DEBIAN_MIRROR") or find_debian_mirror(read_apt_sources())


def cache_dir() -> Path:
    path = Path(os.environ.get("FGPU_CACHE_DIR") or DEFAULT_CACHE_DIR)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(
            f"cannot create the cache directory {path} (set FGPU_CACHE_DIR): {e}"
        ) from e
    return path


def rootfs_tar(log: Log = print) -> Path:
    """The cached root filesystem tar, made with debootstrap when it is not there yet."""
    digest = rootfs_hash()
    cache = cache_dir()
    tar_path = cache / f"rootfs-{SUITE}-{digest}.tar"
    if tar_path.is_file():
        log(f"rootfs: using cached {tar_path}")
        return tar_path
    if os.geteuid() != 0:
        raise BuildError(f"debootstrap needs root to create {tar_path}; run the build as root once")
    if not shutil.which("debootstrap"):
        raise BuildError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = debian_mirror()
    # Work next to the cache (same file system, so the final rename is atomic) and publish the
    # tar only when it is complete: an interrupted run leaves nothing that looks cached.
    work = Path(tempfile.mkdtemp(prefix="rootfs-build-", dir=cache))
    try:
        target = work / "root"
        started = time.monotonic()
        log(f"rootfs: debootstrap {SUITE} from {mirror} (about a minute)")
        _run(debootstrap_command(str(target), mirror), "debootstrap")
        _unmount_below(target)
        _trim(target)
        partial = work / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(target), "-cf", str(partial), "."], "tar")
        partial.rename(tar_path)
        log(f"rootfs: {tar_path} ready in {time.monotonic() - started:.0f} s")
    finally:
        _unmount_below(work)
        shutil.rmtree(work, ignore_errors=True)
    return tar_path


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = result.stdout.splitlines()[-LOG_TAIL_LINES:]
        raise BuildError(failure_message(what, f"exit code {result.returncode}", tail))


def _unmount_below(path: Path) -> None:
    # debootstrap mounts /proc and /sys inside the target while it works; a failed run can leave
    # them mounted, and rmtree must never walk into a live /proc or /sys.
    prefix = str(path.resolve()) + "/"
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def _trim(root: Path) -> None:
    for pattern in ROOTFS_TRIM_GLOBS:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def ensure_rootfs_image(client, log: Log = print) -> str:
    """``fgpu/rootfs:bookworm-<hash>``, imported from the cached tar unless it already exists."""
    import docker.errors

    digest = rootfs_hash()
    reference = rootfs_reference(digest)
    try:
        client.images.get(reference)
        log(f"rootfs: {reference} exists")
        return reference
    except docker.errors.ImageNotFound:
        pass
    tar_path = rootfs_tar(log)
    repository, tag = reference.rsplit(":", 1)
    log(f"rootfs: importing {tar_path.name} as {reference}")
    changes = [
        "ENV LANG=C.UTF-8",
        'CMD ["/bin/bash"]',
        f"LABEL fgpu.rootfs-hash={digest}",
    ]
    try:
        result = client.api.import_image(
            src=str(tar_path), repository=repository, tag=tag, changes=changes
        )
    except docker.errors.APIError as e:
        raise BuildError(f"docker import of {tar_path} failed: {e}") from e
    # The engine reports import errors inside a 200 response, as JSON lines.
    for line in str(result).splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("error"):
            raise BuildError(f"docker import of {tar_path} failed: {message['error']}")
    return reference


def wheel_dir() -> Path:
    return Path(os.environ.get("FGPU_WHEEL_DIR") or DEFAULT_WHEEL_DIR)


def prepare_context(
    image: CatalogImage, dest: Path, ca_dir: Path = HOST_CA_DIR, wheels_from: Path | None = None
) -> None:
    """Copy the recipe folder into ``dest``, the host's extra CA certificates into dest/ca/ and
    the entry's local wheels into dest/wheels/ (both folders exist, possibly empty)."""
    recipe = RECIPES_DIR / str(image.recipe)
    shutil.copytree(recipe, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels_dest = dest / WHEEL_CONTEXT_DIR
    wheels_dest.mkdir(exist_ok=True)
    if image.wheels:
        source = wheels_from or wheel_dir()
        for name in select_wheels(image, _files_in(source), str(source)):
            # A hard link where the file system allows: a PyTorch wheel is about 200 MB.
            try:
                os.link(source / name, wheels_dest / name)
            except OSError:
                shutil.copyfile(source / name, wheels_dest / name)
    ca_dest = dest / CA_CONTEXT_DIR
    ca_dest.mkdir(exist_ok=True)
    if ca_dir.is_dir():
        for cert in sorted(ca_dir.rglob("*.crt")):
            target = ca_dest / cert.relative_to(ca_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cert, target)
    _compile_extensions(image, dest)


def _compile_extensions(image: CatalogImage, dest: Path) -> None:
    """Each JupyterLab extension source in the recipe, compiled into <source>/labextension/."""
    for source in labextension.extension_sources(dest):
        version = image.build_args.get("JUPYTERLAB_VERSION")
        if not version:
            raise BuildError(
                f"{image.name}: the recipe carries the JupyterLab extension {source.name}, "
                "so its entry must pin JUPYTERLAB_VERSION in build_args"
            )
        try:
            built = labextension.compiled(source, version, cache_dir())
        except labextension.ExtensionBuildError as e:
            raise BuildError(f"{image.name}: {e}") from e
        shutil.copytree(built, source / labextension.OUTPUT_DIR, dirs_exist_ok=True)


def _files_in(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []


def read_context_files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def image_id(client, reference: str) -> str | None:
    import docker.errors

    try:
        return client.images.get(reference).id
    except docker.errors.ImageNotFound:
        return None


def build_image(
    client, image: CatalogImage, base_image: str, log: Log = print
) -> tuple[str, str | None]:
    """Build one catalog entry FROM ``base_image`` unless an identical build exists.

    Returns the image id and the id of the image it replaced, if any (see ``remove_superseded``).
    """
    import jupyterhub

    base_id = image_id(client, base_image)
    if base_id is None:
        raise BuildError(f"{image.name}: base image {base_image} is not present")
    args = build_args_for(image, base_image, jupyterhub.__version__)
    with tempfile.TemporaryDirectory(prefix=f"fgpu-build-{image.name}-") as tmp:
        context = Path(tmp) / "context"
        prepare_context(image, context)
        digest = recipe_hash(read_context_files(context), args, base_id)
        previous, labels = _id_and_labels(client, image.image)
        if previous and labels.get(LABEL_RECIPE_HASH) == digest:
            log(f"{image.name}: {image.image} is up to date")
            return previous, None
        started = time.monotonic()
        log(f"{image.name}: building {image.image} from {base_image}")
        _stream_build(client, image, context, args, image_labels(image, digest), log)
    built = image_id(client, image.image)
    if built is None:
        raise BuildError(f"{image.name}: the build finished but {image.image} is missing")
    log(f"{image.name}: built {image.image} in {time.monotonic() - started:.0f} s")
    return built, (previous if previous != built else None)


def remove_superseded(client, superseded: list[tuple[str, str]], log: Log = print) -> None:
    """Remove the images that re-tagged builds replaced, given as (catalog name, image id).

    The tag moved to the new build, so the old image would linger untagged (about 1 GB each time).
    Children go first (the list is in build order, so it is walked backwards), because an old base
    cannot go while an old child still stands on it. The engine refuses while a container, a
    running session for instance, still uses an image, and that is what we want: it is then kept.
    """
    import docker.errors

    for name, previous in reversed(superseded):
        try:
            client.images.remove(previous)
            log(f"{name}: removed the superseded image {previous[:19]}")
        except docker.errors.ImageNotFound:
            # Removing the last child also prunes its untagged parents, an old base among them.
            log(f"{name}: the superseded image {previous[:19]} went with the images built on it")
        except docker.errors.APIError:
            log(f"{name}: the superseded image {previous[:19]} is still in use; kept")


def _id_and_labels(client, reference: str) -> tuple[str | None, dict[str, str]]:
    import docker.errors

    try:
        found = client.images.get(reference)
    except docker.errors.ImageNotFound:
        return None, {}
    return found.id, found.labels or {}


def _stream_build(client, image, context, args, labels, log: Log) -> None:
    import docker.errors

    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    what = f"building {image.image} ({image.name}, recipe {image.recipe})"
    try:
        # The low-level API uses the engine's legacy builder, the only one this engine offers;
        # rm/forcerm leave no intermediate containers behind, even after a failed step.
        for chunk in client.api.build(
            path=str(context),
            tag=image.image,
            buildargs=args,
            labels=labels,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        ):
            text = _ANSI_ESCAPE.sub("", str(chunk.get("stream") or chunk.get("status") or ""))
            for line in text.splitlines():
                if line.strip():
                    tail.append(line.rstrip())
                    log(f"  {line.rstrip()}")
            if chunk.get("error"):
                raise BuildError(failure_message(what, chunk["error"], tail))
    except docker.errors.APIError as e:
        raise BuildError(failure_message(what, str(e), tail)) from e


def build(
    names: Iterable[str] | None = None,
    catalog: Catalog | None = None,
    log: Log = print,
    client=None,
) -> list[str]:
    """Build ``names`` (with their bases), or every entry with a recipe; the references, in order.

    Up-to-date images are skipped. An entry without a recipe can only be used as it is, so it
    must already be present in the engine.
    """
    from fgpu_shared.engine_client import docker_client_from_env

    catalog = catalog or load_catalog()
    order = build_order(catalog, names)
    # A missing local wheel is said before any other work (a base's build, a download).
    for image in order:
        if image.wheels:
            select_wheels(image, _files_in(wheel_dir()), str(wheel_dir()))
    client = client or docker_client_from_env()
    started = time.monotonic()
    rootfs = None
    superseded: list[tuple[str, str]] = []
    for image in order:
        if not image.recipe:
            if image_id(client, image.image) is None:
                raise BuildError(
                    f"{image.name}: {image.image} has no recipe to build it and is not present; "
                    f"load it into the engine (docker load) first"
                )
            log(f"{image.name}: no recipe; using the local {image.image}")
            continue
        if image.base:
            base_image = catalog.get(image.base).image
        else:
            rootfs = rootfs or ensure_rootfs_image(client, log)
            base_image = rootfs
        _, previous = build_image(client, image, base_image, log)
        if previous:
            superseded.append((image.name, previous))
    remove_superseded(client, superseded, log)
    log(f"done: {len(order)} image(s) in {time.monotonic() - started:.1f} s")
    return [image.image for image in order]

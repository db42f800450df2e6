"""Prebuilt JupyterLab extensions that a recipe carries as source (a folder with a package.json
whose ``jupyterlab.extension`` is true), compiled on the host before the image build.

The images have no Node.js, and should not: the extension is compiled here, with the host's
Node.js and the npm registry, by JupyterLab's own ``@jupyterlab/builder`` against the core
packages of the exact JupyterLab that the image installs (its ``staging/package.json``, taken from
that release's wheel). The output (a few kB of JavaScript) is copied into the build context as
``<folder>/labextension/``, where the recipe's Dockerfile picks it up.

Compiling takes about 15 s the first time (npm fetches the builder); the result is cached under
``$FGPU_CACHE_DIR/labextensions/`` by a hash of the source and the JupyterLab version, so a
re-run takes no time and a changed source or version is compiled again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

OUTPUT_DIR = "labextension"
CORE_PACKAGE_JSON = "jupyterlab/staging/package.json"
BUILDER_SCRIPT = "node_modules/@jupyterlab/builder/lib/build-labextension.js"
# Files of a source folder that decide its output; anything else (node_modules, an earlier
# output) is not part of the source.
SOURCE_SUFFIXES = (".js", ".json", ".css")
COMMAND_TIMEOUT_S = 600

Log = Callable[[str], None]


class ExtensionBuildError(RuntimeError):
    """A JupyterLab extension could not be compiled; the message says why."""


# -- pure helpers ------------------------------------------------------------------------------


def is_extension_manifest(package_json: Mapping) -> bool:
    return bool((package_json.get("jupyterlab") or {}).get("extension"))


def source_hash(files: Mapping[str, bytes], jupyterlab_version: str) -> str:
    """A short hash naming the compiled output of these source files for that JupyterLab."""
    spec = {
        "jupyterlab": jupyterlab_version,
        "files": {path: hashlib.sha256(files[path]).hexdigest() for path in sorted(files)},
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def builder_command(core_path: Path) -> list[str]:
    return ["node", BUILDER_SCRIPT, "--core-path", str(core_path), "."]


# -- I/O ---------------------------------------------------------------------------------------


def extension_sources(folder: Path) -> list[Path]:
    """The extension source folders directly inside a recipe folder."""
    found = []
    for manifest in sorted(folder.glob("*/package.json")):
        if is_extension_manifest(json.loads(manifest.read_text())):
            found.append(manifest.parent)
    return found


def read_source(source: Path) -> dict[str, bytes]:
    return {
        path.relative_to(source).as_posix(): path.read_bytes()
        for path in sorted(source.iterdir())
        if path.is_file() and path.suffix in SOURCE_SUFFIXES
    }


def compiled(source: Path, jupyterlab_version: str, cache: Path, log: Log = print) -> Path:
    """The folder holding ``source`` compiled for that JupyterLab, compiling it if needed."""
    files = read_source(source)
    output = cache / "labextensions" / f"{source.name}-{source_hash(files, jupyterlab_version)}"
    if (output / "package.json").is_file():
        return output
    log(f"compiling the JupyterLab extension {source.name} for JupyterLab {jupyterlab_version}")
    core = core_path(jupyterlab_version, cache)
    with tempfile.TemporaryDirectory(prefix="fgpu-labext-", dir=cache) as tmp:
        work = Path(tmp) / source.name
        work.mkdir()
        for name, content in files.items():
            (work / name).write_bytes(content)
        _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], work)
        _run(builder_command(core), work)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(output, ignore_errors=True)
        shutil.copytree(work / OUTPUT_DIR, output)
    return output


def core_path(jupyterlab_version: str, cache: Path) -> Path:
    """A folder with that JupyterLab release's core package.json, taken from its wheel."""
    folder = cache / "jupyterlab-core" / jupyterlab_version
    if (folder / "package.json").is_file():
        return folder
    with tempfile.TemporaryDirectory(prefix="fgpu-jupyterlab-", dir=cache) as tmp:
        _run(_pip_download(jupyterlab_version, tmp), Path(tmp))
        wheels = list(Path(tmp).glob("jupyterlab-*.whl"))
        if not wheels:
            raise ExtensionBuildError(f"pip found no wheel of jupyterlab=={jupyterlab_version}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            content = wheel.read(CORE_PACKAGE_JSON)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_bytes(content)
    return folder


def _pip_download(version: str, dest: str) -> list[str]:
    return [
        *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
        *("--only-binary=:all:", "--dest", dest, f"jupyterlab=={version}"),
    ]


def _run(command: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except FileNotFoundError as e:
        raise ExtensionBuildError(
            f"{command[0]} is not installed: JupyterLab extensions are compiled with the host's "
            "Node.js and npm (Debian: apt install nodejs npm)"
        ) from e
    except subprocess.TimeoutExpired as e:
        raise ExtensionBuildError(f"{' '.join(command[:3])} took over {COMMAND_TIMEOUT_S} s") from e
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ExtensionBuildError(f"{' '.join(command[:3])} failed:\n{tail}")

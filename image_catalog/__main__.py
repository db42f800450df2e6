"""Command line: ``python -m image_catalog build [NAME ...] | --all | --heavy`` and ``... list``.

Installed as the ``fgpu-image`` console script. Exit codes: 0 done, 1 a build failed, 2 a usage
error (an unknown image name, a bad catalog file, neither names nor --all).
"""

from __future__ import annotations

import argparse
import sys

from .build import BuildError, UnknownImageError, build, heavy_names
from .catalog import CatalogError, load_catalog


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fgpu-image", description="Build and list the fgpu-hub single-user images."
    )
    parser.add_argument(
        "--catalog", metavar="PATH", help="catalog file (default: the shipped catalog.yaml)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser(
        "build", help="build images offline (bases first; up-to-date images are skipped)"
    )
    build_cmd.add_argument("names", nargs="*", metavar="NAME", help="catalog names to build")
    build_cmd.add_argument(
        "--all", action="store_true", help="build every catalog entry that has a recipe"
    )
    build_cmd.add_argument(
        "--heavy",
        action="store_true",
        help="build the heavy entries the hub builds behind itself (prebuild: false, not hidden)",
    )
    commands.add_parser("list", help="list the catalog entries")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.catalog)
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "list":
        _print_list(catalog)
        return 0
    # Building everything takes minutes, so it has to be asked for, never the default.
    if args.all + args.heavy + bool(args.names) != 1:
        parser.error("build: give image names, --all or --heavy (one of them)")
    if args.heavy:
        return _build_each(heavy_names(catalog), catalog)
    try:
        build(None if args.all else args.names, catalog=catalog, log=_log)
    except UnknownImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _build_each(names: list[str], catalog) -> int:
    """Build each image on its own, so that one that cannot be built (a wheel missing from
    FGPU_WHEEL_DIR, say) does not keep the others from being built; each failure is named."""
    failed = []
    for name in names:
        try:
            build([name], catalog=catalog, log=_log)
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"error: not built: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _log(line: str) -> None:
    print(line, flush=True)


def _print_list(catalog) -> None:
    rows = [("NAME", "IMAGE", "RECIPE", "BASE")]
    rows += [
        (image.name, image.image, image.recipe or "-", image.base or "-")
        for image in catalog.images
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        print("  ".join([*cells, row[-1]]))


if __name__ == "__main__":
    sys.exit(main())

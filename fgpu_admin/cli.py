"""``fgpu-hub COMMAND``: one entry point, one module per command.

Each command module has ``add_arguments(parser)`` and ``run(args) -> int`` (the exit code), and
its module docstring's first line is its help. Errors meant for the admin are raised as
``AdminError`` and printed as one line, exit code 1 (argparse's own usage errors exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command → module under fgpu_admin
COMMANDS: dict[str, str] = {
    "backup": "backup",
    "restore": "restore",
    "doctor": "doctor",
    "install-service": "install_service",
    "node-agent": "node_agent",
}


class AdminError(Exception):
    """A problem the admin can act on: printed as ``error: <message>``, exit code 1."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fgpu-hub", description="Run the fGPU hub: back up, restore, check, install."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"fgpu_admin.{module_name}")
        summary = (module.__doc__ or "").strip().splitlines()[0]
        sub = commands.add_parser(name, help=summary, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except AdminError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The checks behind ``scripts/gpu-node``: the OS, the NVIDIA driver, Docker's daemon.json, and
whether ``nvidia-smi`` in a session shows HAMi-core's capped memory.

The script turns a Debian/Ubuntu GPU host into a node and calls this module for everything that
parses or decides (``python3 -m fgpu_admin.gpu_node COMMAND``), so that those parts are tested
here on recorded ``nvidia-smi`` output. A GPU node has no virtualenv of the project, only the
system's ``python3`` (3.8 on Ubuntu 20.04): this module uses the standard library alone, and
nothing else of the project.

Pure functions first; the small command line at the end does the I/O. Exit codes of the command
line: 0 fine, 1 a check failed, 2 bad arguments or input, 3 the host is not ready (OS, driver).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field

#: CUDA 12's minimum Linux driver (its minor version compatibility): the CUDA images of the
#: catalog (`pytorch-2.5-cuda`, CUDA 12) and the self-check's image need it.
MIN_DRIVER_VERSION = "525.60.13"
#: Debian 11 (bullseye) and Ubuntu 20.04 are the oldest that NVIDIA's container toolkit and
#: HAMi-core's build image (Ubuntu 20.04's glibc) still serve.
MIN_OS_VERSION = {"debian": (11,), "ubuntu": (20, 4)}
#: What every node's daemon.json must hold besides the NVIDIA runtime (docs/source/howto/swarm.md, "GPU nodes in a
#: Swarm"): a Swarm service cannot ask for no-new-privileges at API 1.41, and sessions on a
#: node's bridge must not reach one another.
REQUIRED_DAEMON_SETTINGS = {"no-new-privileges": True, "icc": False}
MIB = 1024**2

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_READY = 0, 1, 2, 3


class InputError(ValueError):
    """Input this module cannot read: a message for the admin, one line."""


# --- nvidia-smi ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class SmiReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[Gpu] = field(default_factory=list)


_DRIVER = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_CUDA = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")
# "|   0  NVIDIA GeForce RTX 3070        Off | 00000000:01:00.0 Off |  N/A |": the GPU's first
# row names it; its bus id tells it from the process table's rows.
_GPU_ROW = re.compile(r"^\|\s*(\d+)\s+(.+?)\s+(?:On|Off)\s*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:")
# "|  0%   38C    P8    12W / 220W |      1MiB /  8192MiB |": its second row holds the memory.
_MEMORY_CELL = re.compile(r"\|\s*(\d+)\s*MiB\s*/\s*(\d+)\s*MiB\s*\|")


def parse_smi_table(text: str) -> SmiReport:
    """`nvidia-smi`'s table: driver and CUDA versions from the header, each GPU's index, name and
    memory (used / total, in MiB) from its rows. Layouts of drivers 470 to 570 alike."""
    gpus: list[Gpu] = []
    pending: tuple[int, str] | None = None
    for line in text.splitlines():
        row = _GPU_ROW.match(line)
        if row:
            pending = (int(row.group(1)), row.group(2).strip())
            continue
        memory = _MEMORY_CELL.search(line)
        if memory and pending is not None:
            index, name = pending
            gpus.append(Gpu(index, name, int(memory.group(2)), int(memory.group(1))))
            pending = None
    driver, cuda = _DRIVER.search(text), _CUDA.search(text)
    if driver is None and not gpus:
        raise InputError("this is not nvidia-smi's table: no 'Driver Version' and no GPU row")
    return SmiReport(driver and driver.group(1), cuda and cuda.group(1), gpus)


_CSV_FIELDS = {
    "index": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "name": "name",
    "gpu_name": "name",
    "memory.total": "memory_total",
    "memory.used": "memory_used",
    "driver_version": "driver_version",
}


def _csv_field(header: str) -> str | None:
    """`memory.total [MiB]` → `memory_total`; fields this module does not read → None."""
    return _CSV_FIELDS.get(header.split("[")[0].strip().lower())


def _mib(value: str, what: str) -> int:
    """`8192 MiB`, `8192` (nounits) → 8192; refuses what is no size."""
    number = value.strip()
    if number.endswith("MiB"):
        number = number[: -len("MiB")].strip()
    if not number.isdigit():
        raise InputError(f"{what} is {value.strip()!r}, not a size in MiB")
    return int(number)


def parse_smi_csv(text: str, fields: list[str] | None = None) -> SmiReport:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`. With a header the columns
    name themselves; without one, pass the query's `fields` in order."""
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(r)]
    if not rows:
        raise InputError("nvidia-smi printed no GPU")
    if fields is None:
        fields, rows = [c.strip() for c in rows[0]], rows[1:]
    names = [_csv_field(f) for f in fields]
    if "memory_total" not in names:
        raise InputError("the nvidia-smi query has no memory.total column")
    gpus, drivers = [], set()
    for position, row in enumerate(rows):
        if len(row) != len(names):
            raise InputError(f"nvidia-smi's line {row!r} has {len(row)} fields, not {len(names)}")
        # No zip(strict=): nodes may run Python 3.8; the lengths were compared just above.
        value = {n: v.strip() for n, v in zip(names, row) if n}  # noqa: B905
        used = value.get("memory_used")
        gpus.append(
            Gpu(
                index=int(value["index"]) if value.get("index", "").isdigit() else position,
                name=value.get("name", ""),
                memory_total_mib=_mib(value["memory_total"], "memory.total"),
                memory_used_mib=_mib(used, "memory.used") if used else None,
                uuid=value.get("uuid") or None,
            )
        )
        if value.get("driver_version"):
            drivers.add(value["driver_version"])
    if len(drivers) > 1:
        raise InputError(f"nvidia-smi reports several driver versions: {sorted(drivers)}")
    return SmiReport(drivers.pop() if drivers else None, None, gpus)


def parse_smi(text: str, fields: list[str] | None = None) -> SmiReport:
    """Either form: the table (its header starts with `+---` or a date line) or CSV."""
    if "NVIDIA-SMI" in text or _MEMORY_CELL.search(text):
        return parse_smi_table(text)
    return parse_smi_csv(text, fields)


# --- versions, OS ----------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, ...]:
    """`550.54.15` → (550, 54, 15); `22.04` → (22, 4)."""
    parts = text.strip().split(".")
    if not text.strip() or not all(p.isdigit() for p in parts):
        raise InputError(f"{text.strip()!r} is not a version number")
    return tuple(int(p) for p in parts)


def driver_problem(version: str | None, minimum: str = MIN_DRIVER_VERSION) -> str | None:
    """Why this driver will not do, or None."""
    if not version:
        return "nvidia-smi answered without a driver version"
    if parse_version(version) < parse_version(minimum):
        return (
            f"the NVIDIA driver is {version}; CUDA 12 sessions need {minimum} or newer. "
            "Upgrade the driver (Debian: nvidia-driver from non-free; Ubuntu: ubuntu-drivers "
            "install), reboot, and run this again"
        )
    return None


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release's KEY=value lines (values optionally quoted)."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key] = value.strip().strip("\"'")
    return values


def os_problem(os_release: dict[str, str]) -> str | None:
    """Why this OS is not one the script supports (Debian ≥ 11, Ubuntu ≥ 20.04), or None."""
    distro = os_release.get("ID", "").lower()
    pretty = os_release.get("PRETTY_NAME") or distro or "an unknown system"
    if distro not in MIN_OS_VERSION:
        return (
            f"{pretty} is not Debian or Ubuntu; this script sets up Debian ≥ 11 or Ubuntu ≥ 20.04"
        )
    try:
        version = parse_version(os_release.get("VERSION_ID", ""))
    except InputError:
        return f"{pretty} names no VERSION_ID in /etc/os-release (testing/unstable?)"
    minimum = MIN_OS_VERSION[distro]
    if version < minimum:
        wanted = ".".join(f"{n:02d}" if i else str(n) for i, n in enumerate(minimum))
        return f"{pretty} is too old; this script needs {distro} {wanted} or newer"
    return None


# --- daemon.json -----------------------------------------------------------------------------


def merge_daemon_config(config: dict) -> tuple[dict, list[str]]:
    """`config` with REQUIRED_DAEMON_SETTINGS set, every other key kept as it was, and the list
    of what changed (empty: nothing to write, no restart needed)."""
    merged = dict(config)
    changes = []
    for key, wanted in REQUIRED_DAEMON_SETTINGS.items():
        if merged.get(key) is wanted:
            continue
        before = json.dumps(merged[key]) if key in merged else "unset"
        merged[key] = wanted
        changes.append(f"{key}: {before} -> {json.dumps(wanted)}")
    return merged, changes


def daemon_config_problems(config: dict, runtime_only: bool = False) -> list[str]:
    """What a GPU node's daemon.json still lacks (docs/source/howto/swarm.md, "GPU nodes in a Swarm"); with
    `runtime_only`, only the NVIDIA runtime (what `nvidia-ctk runtime configure` sets)."""
    problems = []
    if config.get("default-runtime") != "nvidia":
        problems.append(
            f'"default-runtime" is {json.dumps(config.get("default-runtime"))}, not "nvidia" '
            "(nvidia-ctk runtime configure --runtime=docker --set-as-default)"
        )
    if "nvidia" not in (config.get("runtimes") or {}):
        problems.append('"runtimes" has no "nvidia" entry (nvidia-ctk runtime configure)')
    if runtime_only:
        return problems
    for key, wanted in REQUIRED_DAEMON_SETTINGS.items():
        if config.get(key) is not wanted:
            shown = json.dumps(config[key]) if key in config else "unset"
            problems.append(f'"{key}" is {shown}, not {json.dumps(wanted)}')
    return problems


def load_daemon_config(text: str) -> dict:
    """daemon.json's object; an empty or missing file is `{}`."""
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"daemon.json is not valid JSON ({e}); fix it by hand first") from None
    if not isinstance(config, dict):
        raise InputError("daemon.json does not hold a JSON object; fix it by hand first")
    return config


def dump_daemon_config(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


# --- the self-check --------------------------------------------------------------------------


def hami_limits(memory_total_mib: int, fraction: float) -> tuple[int, int]:
    """(memory MiB, SM percent) for a `fraction` of a GPU, as `fgpu_spawner.gpu_sharing` computes
    them for a `hami` session (tests/test_gpu_node.py holds the two to the same numbers)."""
    if not 0 < fraction <= 1:
        raise InputError(f"a GPU share must be in (0, 1], not {fraction}")
    memory = max(1, math.floor(fraction * memory_total_mib * MIB) // MIB)
    sm = min(100, max(1, math.floor(fraction * 100 + 0.5)))
    return memory, sm


def selfcheck_env(memory_total_mib: int, fraction: float, uuid: str) -> dict[str, str]:
    """The HAMi variables a one-GPU `hami` session with this share gets (container index 0)."""
    memory, sm = hami_limits(memory_total_mib, fraction)
    return {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{memory}m",
        "CUDA_DEVICE_SM_LIMIT_0": str(sm),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/cudevshr.cache",
    }


#: What a `hami` session's command starts with (fgpu_spawner.gpu_sharing.hami_region_first_prefix;
#: tests/test_gpu_node.py holds the two equal): HAMi-core's default region path is linked to the
#: session's, and HAMi-core's tool creates the region from the session's limits, before the
#: command. The self-check runs through it, so a node where the tool cannot run is caught here.
SELFCHECK_PREFIX = (
    "/bin/sh",
    "-c",
    "ln -sfn /usr/local/vgpu/cache/cudevshr.cache /tmp/cudevshr.cache"
    ' && "$0" --create_new && exec "$@"',
    "/usr/local/vgpu/shrreg-tool",
)


@dataclass(frozen=True)
class CapCheck:
    ok: bool
    message: str


_HAMI_ERROR = re.compile(r"\[HAMI-core ERROR[^\]]*\]:?\s*(.*)")


def check_capped(output: str, expected_mib: int, card_mib: int) -> CapCheck:
    """Did nvidia-smi in the session show the capped memory? `output` is what the container
    printed (the table, CSV, or both); every GPU it lists must show `expected_mib` as its total
    (HAMi-core reports the limit itself), give or take 1 MiB, and HAMi-core must not have logged
    an error (it goes on without its shared region rather than stop)."""
    errors = [m.group(1).strip() for m in _HAMI_ERROR.finditer(output)]
    if errors:
        return CapCheck(False, f"HAMi-core reported an error in the session: {errors[0]}")
    totals = _reported_totals(output)
    if not totals:
        return CapCheck(False, "nvidia-smi in the session listed no GPU")
    if len(totals) > 1 and len(set(totals)) > 1:
        return CapCheck(False, f"the session sees several GPUs ({totals} MiB); one was granted")
    shown = totals[0]
    if abs(shown - expected_mib) <= 1:
        return CapCheck(
            True,
            f"nvidia-smi in the session shows {shown} MiB of the card's {card_mib} MiB: capped "
            f"to the 0.5 grant's {expected_mib} MiB",
        )
    if shown >= card_mib - 1:
        return CapCheck(
            False,
            f"nvidia-smi in the session shows the whole card ({shown} MiB): HAMi-core is not "
            "loaded (library or preload file missing, or the image's loader ignores it)",
        )
    return CapCheck(False, f"nvidia-smi in the session shows {shown} MiB; expected {expected_mib}")


def _reported_totals(output: str) -> list[int]:
    """Every memory total the output shows, table rows and CSV lines alike."""
    totals = [int(m.group(2)) for m in _MEMORY_CELL.finditer(output)]
    for line in output.splitlines():
        stripped = line.strip()
        if stripped.isdigit() or re.fullmatch(r"\d+\s*MiB", stripped):
            totals.append(_mib(stripped, "memory.total"))
    return totals


def parse_registry(text: str) -> tuple[str, int]:
    """(host, port) of `--registry HOST:PORT`; the port is required (the rule names it)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        raise InputError(
            f"--registry takes HOST:PORT, e.g. registry.example.org:5000 (got {text!r})"
        )
    return host, int(port)


def registry_rule(address: str, port: int) -> list[str]:
    """The DOCKER-USER rule that turns away the node's containers' traffic to the registry at
    `address:port` (iptables arguments after the chain): rejected, so that a session fails at
    once. The engine's own pulls leave from the host's stack (OUTPUT) and never meet it."""
    return f"-d {address}/32 -p tcp --dport {port} -j REJECT --reject-with tcp-reset".split()


def registry_dropin(addresses: list[str], port: int) -> str:
    """A systemd drop-in for docker.service that puts the rule first in DOCKER-USER each time
    dockerd has started (dockerd makes the chain and keeps what is in it, but iptables rules
    do not survive a reboot)."""
    lines = [
        "# Written by scripts/gpu-node --registry: the node's containers (sessions) never reach the",
        "# site's registry; the engine pulls from the host's own stack, which the rule never sees.",
        "[Service]",
    ]
    for address in sorted(set(addresses)):
        rule = " ".join(registry_rule(address, port))
        lines.append(
            f"ExecStartPost=/bin/sh -c 'iptables -C DOCKER-USER {rule} 2>/dev/null || "
            f"iptables -I DOCKER-USER 1 {rule}'"
        )
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------


def _write_if_changed(path: str, text: str) -> None:
    """Replace `path` in one step (a half-written daemon.json would keep dockerd from starting),
    keeping its mode."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
    fd, partial = tempfile.mkstemp(prefix=".daemon.json.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def cmd_os_check(args) -> int:
    text = _read(args.os_release)
    if not text:
        print(f"{args.os_release} is missing: cannot tell which system this is", file=sys.stderr)
        return EXIT_NOT_READY
    release = parse_os_release(text)
    problem = os_problem(release)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_NOT_READY
    print(release.get("PRETTY_NAME", release["ID"]))
    return EXIT_OK


def cmd_driver_check(args) -> int:
    report = parse_smi(sys.stdin.read(), args.fields.split(",") if args.fields else None)
    if not report.gpus:
        print(
            "nvidia-smi lists no GPU: is the driver loaded (lsmod | grep nvidia)?", file=sys.stderr
        )
        return EXIT_NOT_READY
    problem = driver_problem(report.driver_version, args.min_version)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_NOT_READY
    for gpu in report.gpus:
        print(f"{gpu.index}\t{gpu.uuid or ''}\t{gpu.memory_total_mib}\t{gpu.name}")
    return EXIT_OK


def cmd_merge_daemon_json(args) -> int:
    config = load_daemon_config(_read(args.path))
    merged, changes = merge_daemon_config(config)
    if not changes:
        print(f"{args.path}: unchanged")
        return EXIT_OK
    _write_if_changed(args.path, dump_daemon_config(merged))
    print(f"{args.path}: {'; '.join(changes)}")
    return EXIT_OK


def cmd_check_daemon_json(args) -> int:
    problems = daemon_config_problems(load_daemon_config(_read(args.path)), args.runtime_only)
    for problem in problems:
        print(f"{args.path}: {problem}")
    return EXIT_FAILED if problems else EXIT_OK


def cmd_selfcheck_env(args) -> int:
    for key, value in selfcheck_env(args.memory_mib, args.fraction, args.uuid).items():
        print(f"{key}={value}")
    return EXIT_OK


def cmd_selfcheck_prefix(args) -> int:
    print("\n".join(SELFCHECK_PREFIX))
    return EXIT_OK


def cmd_check_capped(args) -> int:
    expected, _ = hami_limits(args.card_mib, args.fraction)
    result = check_capped(sys.stdin.read(), expected, args.card_mib)
    print(result.message, file=sys.stdout if result.ok else sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_parse_smi(args) -> int:
    report = parse_smi(sys.stdin.read(), args.fields.split(",") if args.fields else None)
    print(json.dumps(asdict(report), indent=2))
    return EXIT_OK


def cmd_parse_registry(args) -> int:
    host, port = parse_registry(args.registry)
    print(host, port)
    return 0


def cmd_registry_dropin(args) -> int:
    print(registry_dropin(args.address, args.port), end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m fgpu_admin.gpu_node", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("os-check", help="is this Debian ≥ 11 or Ubuntu ≥ 20.04?")
    p.add_argument("--os-release", default="/etc/os-release")
    p.set_defaults(run=cmd_os_check)
    p = sub.add_parser(
        "driver-check", help="nvidia-smi --query-gpu output on stdin: driver new enough?"
    )
    p.add_argument("--min-version", default=MIN_DRIVER_VERSION)
    p.add_argument("--fields", help="the query's fields, for output without a header")
    p.set_defaults(run=cmd_driver_check)
    p = sub.add_parser(
        "merge-daemon-json", help="add no-new-privileges and icc=false, keep the rest"
    )
    p.add_argument("path")
    p.set_defaults(run=cmd_merge_daemon_json)
    p = sub.add_parser("check-daemon-json", help="what a GPU node's daemon.json still lacks")
    p.add_argument("path")
    p.add_argument("--runtime-only", action="store_true", help="only the NVIDIA runtime")
    p.set_defaults(run=cmd_check_daemon_json)
    p = sub.add_parser("selfcheck-env", help="the HAMi variables of a one-GPU session")
    p.add_argument("--memory-mib", type=int, required=True)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--uuid", required=True)
    p.set_defaults(run=cmd_selfcheck_env)
    p = sub.add_parser("selfcheck-prefix", help="a hami session's command prefix, one per line")
    p.set_defaults(run=cmd_selfcheck_prefix)
    p = sub.add_parser("check-capped", help="the session's nvidia-smi output on stdin: capped?")
    p.add_argument("--card-mib", type=int, required=True)
    p.add_argument("--fraction", type=float, default=0.5)
    p.set_defaults(run=cmd_check_capped)
    p = sub.add_parser("parse-smi", help="nvidia-smi output (table or CSV) on stdin, as JSON")
    p.add_argument("--fields", help="the query's fields, for CSV without a header")
    p.set_defaults(run=cmd_parse_smi)
    p = sub.add_parser("parse-registry", help="HOST:PORT of --registry, as 'HOST PORT'")
    p.add_argument("registry")
    p.set_defaults(run=cmd_parse_registry)
    p = sub.add_parser("registry-dropin", help="docker.service's drop-in with the registry rule")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("address", nargs="+")
    p.set_defaults(run=cmd_registry_dropin)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

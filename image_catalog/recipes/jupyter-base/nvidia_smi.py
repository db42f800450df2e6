#!/usr/bin/python3 -I
"""`nvidia-smi` in every fGPU hub session (installed as /usr/local/bin/nvidia-smi).

On a GPU node the NVIDIA runtime mounts the driver's own nvidia-smi (/usr/bin/nvidia-smi) into a
session that holds GPUs, and HAMi-core caps the memory it reports: this script only hands over to
it. In the `simulated` sharing mode (FGPU_SIMULATED=1, no GPU at all) it prints the session's
slice in nvidia-smi's layout, marked SIMULATED: memory = the granted share × the simulated GPU's
memory, the share of SMs, the GPU's name, index and UUID. It reads what the spawner's pure builder
sets (fgpu_spawner/gpu_sharing.py): `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT_<i>`,
the limits HAMi-core would enforce, and `FGPU_GPU_UUID_<i>`, `FGPU_GPU_NAME_<i>`,
`FGPU_GPU_MEMORY_MIB_<i>` for the GPU itself. A session without a GPU gets what nvidia-smi says
on a machine without one: "No devices were found", exit code 6.

Scripts get `-L` and `--query-gpu=FIELD,... --format=csv[,noheader][,nounits]` (with `-i`).

The shebang runs Debian's own Python in isolated mode (-I): no user site, no PYTHON* variables,
so nothing a student installs, into the image's /opt/venv or ~/.local, can break it.
"""

from __future__ import annotations

import json
import os
import sys
import time

# nvidia-smi's exit codes (its man page, "RETURN VALUE").
EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_FOUND = 6
NO_DEVICES = "No devices were found"
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
# The driver's own nvidia-smi where the NVIDIA container runtime mounts it.
DRIVER_NVIDIA_SMI = "/usr/bin/nvidia-smi"
WIDTH = 87  # between the outer bars, as nvidia-smi 535 prints its table


class Gpu:
    """One granted GPU as the session sees it: container index, the GPU, and the slice."""

    def __init__(self, index: int, uuid: str, name: str, total_mib: int, limit_mib: int, sm: int):
        self.index, self.uuid, self.name = index, uuid, name
        self.total_mib, self.limit_mib, self.sm_percent = total_mib, limit_mib, sm


def granted_gpus(env) -> list[Gpu]:
    """The simulated GPUs of the grant, in container order, from the spawner's variables."""
    gpus = []
    index = 0
    while f"FGPU_GPU_UUID_{index}" in env:
        total = int(env.get(f"FGPU_GPU_MEMORY_MIB_{index}", "0"))
        limit = _mib(env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{index}", ""), total)
        sm = int(env.get(f"CUDA_DEVICE_SM_LIMIT_{index}", "100"))
        name = env.get(f"FGPU_GPU_NAME_{index}", "Simulated GPU")
        gpus.append(Gpu(index, env[f"FGPU_GPU_UUID_{index}"], name, total, limit, sm))
        index += 1
    return gpus


def _mib(limit: str, default: int) -> int:
    """HAMi-core's limit syntax: a number with an optional binary k/m/g suffix (bytes without)."""
    text = limit.strip().lower()
    if not text:
        return default
    scale = {"k": 1 / 1024, "m": 1, "g": 1024}.get(text[-1])
    if scale is None:
        return int(text) // 1024**2
    return int(float(text[:-1]) * scale)


def share(gpu: Gpu, grant_json: str | None) -> float:
    """The granted fraction of the GPU, from FGPU_GRANT (or the memory limit's, if absent)."""
    try:
        return float(json.loads(grant_json or "{}")["gpus"][gpu.uuid])
    except (KeyError, TypeError, ValueError):
        return gpu.limit_mib / gpu.total_mib if gpu.total_mib else 1.0


# --- --query-gpu -----------------------------------------------------------------------------

#: field → (unit shown in the header and after the value, value)
FIELDS = {
    "index": ("", lambda g: str(g.index)),
    "name": ("", lambda g: g.name),
    "gpu_name": ("", lambda g: g.name),
    "uuid": ("", lambda g: g.uuid),
    "gpu_uuid": ("", lambda g: g.uuid),
    "memory.total": ("MiB", lambda g: str(g.limit_mib)),
    "memory.used": ("MiB", lambda g: "0"),
    "memory.free": ("MiB", lambda g: str(g.limit_mib)),
    "utilization.gpu": ("%", lambda g: "0"),
    "utilization.memory": ("%", lambda g: "0"),
    "driver_version": ("", lambda g: "N/A"),
    "pci.bus_id": ("", lambda g: f"00000000:{g.index:02X}:00.0"),
    "compute_mode": ("", lambda g: "Default"),
}


def _header(field: str) -> str:
    unit = FIELDS[field][0] if field in FIELDS else ""
    return f"{field} [{unit}]" if unit else field


def query(gpus: list[Gpu], fields: list[str], fmt: list[str]) -> tuple[int, str]:
    unknown = [f for f in fields if f not in FIELDS and f != "count"]
    if unknown:
        return EXIT_INVALID_ARGUMENT, f'Field "{unknown[0]}" is not a valid field to query.'
    if "csv" not in fmt:
        return EXIT_INVALID_ARGUMENT, '"--format" needs csv, e.g. --format=csv,noheader'
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(_header(field) for field in fields))
    for gpu in gpus:
        values = []
        for field in fields:
            if field == "count":
                values.append(str(len(gpus)))
                continue
            unit, value = FIELDS[field]
            text = value(gpu)
            values.append(f"{text} {unit}" if unit and "nounits" not in fmt else text)
        lines.append(", ".join(values))
    return 0, "\n".join(lines)


# --- the table -------------------------------------------------------------------------------


def _cells(left: str, middle: str, right: str) -> str:
    """One row of the device table: three cells, each closed by a space as nvidia-smi's are."""
    return f"|{left:<40} |{middle:<21} |{right:<21} |"


def table(gpus: list[Gpu], grant_json: str | None, now: float) -> str:
    rule = "+" + "-" * 41 + "+" + "-" * 22 + "+" + "-" * 22 + "+"
    line = "+" + "-" * WIDTH + "+"
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)),
        line,
        "| "
        + "NVIDIA-SMI SIMULATED (fGPU hub)   Driver Version: N/A   CUDA Version: N/A".ljust(86)
        + "|",
        rule,
        _cells(
            " GPU  Name                 Persistence-M",
            " Bus-Id        Disp.A",
            " Volatile Uncorr. ECC",
        ),
        _cells(
            " Fan  Temp   Perf          Pwr:Usage/Cap",
            "         Memory-Usage",
            " GPU-Util  Compute M.",
        ),
        _cells("", "", "               MIG M."),
        "|" + "=" * 41 + "+" + "=" * 22 + "+" + "=" * 22 + "|",
    ]
    for gpu in gpus:
        name = gpu.name if len(gpu.name) <= 28 else gpu.name[:25] + "..."
        memory = f"{0:>6}MiB / {gpu.limit_mib:>6}MiB"
        out += [
            _cells(
                f" {gpu.index:>3}  {name:<28}   Off",
                f" 00000000:{gpu.index:02X}:00.0 Off",
                f"{'N/A':>21}",
            ),
            _cells(
                " N/A   N/A    P0              N/A /  N/A",
                f"{memory:>21}",
                f"{'0%      Default':>21}",
            ),
            _cells("", "", f"{'N/A':>21}"),
            rule,
        ]
    out += [
        "",
        line,
        "| " + "SIMULATED: this host has no GPU; fGPU hub simulates your slice.".ljust(86) + "|",
    ]
    for gpu in gpus:
        part = share(gpu, grant_json)
        text = (
            f"  GPU {gpu.index}: {part:.0%} of {gpu.name}: {gpu.limit_mib} MiB of "
            f"{gpu.total_mib} MiB, {gpu.sm_percent}% of its SMs"
        )
        out.append("| " + text.ljust(86) + "|")
    out += [
        line,
        "",
        line,
        "| " + "Processes:".ljust(86) + "|",
        "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |",
        "|        ID   ID                                                             Usage      |",
        "|" + "=" * WIDTH + "|",
        "|  " + "No running processes found".ljust(85) + "|",
        line,
    ]
    return "\n".join(out)


# --- arguments -------------------------------------------------------------------------------


def parse(argv: list[str]) -> dict | None:
    """nvidia-smi's options that this stand-in answers, or None for anything else."""
    options: dict = {"list": False, "fields": None, "format": None, "ids": None, "help": False}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("-L", "--list-gpus") and not eq:
            options["list"] = True
        elif key in ("-h", "--help") and not eq:
            options["help"] = True
        elif key in ("--query-gpu", "--format", "-i", "--id"):
            if not eq:
                if not args:
                    return None
                value = args.pop(0)
            name = {"--query-gpu": "fields", "--format": "format"}.get(key, "ids")
            options[name] = [part.strip() for part in value.split(",") if part.strip()]
        else:
            return None
    return options


def run(argv: list[str], env, now: float | None = None) -> tuple[int, str]:
    """(exit code, stdout text) for the simulated slice; pure, so it is tested on the host."""
    options = parse(argv)
    if options is None:
        return EXIT_INVALID_ARGUMENT, INVALID
    if options["help"]:
        return 0, __doc__.strip()
    gpus = granted_gpus(env) if env.get("FGPU_SIMULATED") == "1" else []
    if options["ids"] is not None:
        gpus = [g for g in gpus if str(g.index) in options["ids"] or g.uuid in options["ids"]]
    if not gpus:
        return EXIT_NOT_FOUND, NO_DEVICES
    if options["fields"] is not None:
        return query(gpus, options["fields"], options["format"] or [])
    if options["format"] is not None:
        return EXIT_INVALID_ARGUMENT, INVALID
    if options["list"]:
        return 0, "\n".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in gpus)
    return 0, table(gpus, env.get("FGPU_GRANT"), time.time() if now is None else now)


def main() -> int:
    env = os.environ
    real = DRIVER_NVIDIA_SMI
    if env.get("FGPU_SIMULATED") != "1" and os.access(real, os.X_OK):
        os.execv(real, [real, *sys.argv[1:]])
    code, text = run(sys.argv[1:], env)
    print(text)
    if code == EXIT_NOT_FOUND:
        # stderr, so that a script reading stdout sees exactly what the real one prints.
        print(
            "fGPU hub: this session holds no GPU (launch it with an fGPU share).", file=sys.stderr
        )
    return code


if __name__ == "__main__":
    sys.exit(main())

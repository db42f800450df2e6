"""A grant's GPU slices → container settings, per `gpu_sharing` mode (docs/source/explanation/architecture.md, "fGPU inside the container"). Pure: no I/O.

Modes:

- `hami`: the granted GPUs as a device request, HAMi-core's `libvgpu.so` bound read-only and loaded
  through the container's `/etc/ld.so.preload` (a read-only bind of a host file that names the
  library, as HAMi's device plugin does), and per-device limits. The dynamic loader reads that file
  for every process whatever its environment, so `env -u LD_PRELOAD` or a clean `execve` does not
  shed the limits, and the session user (no capabilities) cannot change or unmount it. Library and
  preload file are bind *mounts*, which the engine refuses when their host file is missing: a
  `-v` bind would create an empty folder there instead and start the session without limits. HAMi-core reads `CUDA_DEVICE_MEMORY_LIMIT_<i>` with
  an optional binary k/m/g suffix (we write whole MiB, "<n>m", as HAMi's device plugin does) and
  `CUDA_DEVICE_SM_LIMIT_<i>` as a percentage. Zero means "no limit" to HAMi-core, so every limit is
  at least 1. Whole GPUs get limits too (all their memory, 100%, which HAMi-core does not throttle):
  one rule for every device keeps the env predictable. Each session gets its own shared-region
  cache file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`) in a host directory of its own, so two sessions
  never share one accounting region, and its own lock folder (HAMi-core locks
  `/tmp/vgpulock/lock` in the container): a host-wide one, writable by every session, let one
  session hold the lock and stall every other session's GPU start-up on the host.
  HAMi-core takes the limits from the environment of whichever process first opens the region
  and keeps them there: later processes read the region's limits, not their own environment
  (multiprocess_memory_limit.c, `try_create_shrreg`). So the session's command starts with
  HAMi-core's own `shrreg-tool --create_new` (bound read-only), which creates the region from the
  spawner's limits before any process of the student runs, and links HAMi-core's default region
  path (`/tmp/cudevshr.cache`, used when the variable is unset) to it; `command_prefix` carries
  both. This pins the limits for every process that uses the session's region. It does not stop
  a process that names another cache file in its own environment, or writes the region file
  itself (it must stay writable: HAMi-core maps it read-write and exits when it cannot): see the
  admin guide, "How strict is a GPU slice".
- `mig`: the strict mode, on cards with MIG (A100, A30, H100...): each "GPU" of the node is a MIG
  instance (its `MIG-` UUID in the node's `fgpu.gpus` label), which the driver isolates in
  hardware: its own memory and SMs, which nothing in the session can change. Whole instances
  only: a share below 1 is refused, since two sessions would share one instance without limits,
  and so is a UUID that is not a MIG instance's, which would hand out a whole card.
- `mps`: the device request plus MPS client limits. `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` is a single
  value for every device of a client, so a grant of whole GPUs plus one fraction takes the
  fraction's share on all of them (the whole GPUs are throttled too: fail closed).
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` is per device; NVIDIA documents that it takes device ordinals
  or UUIDs, and UUIDs are used so that no device order can put a limit on the wrong GPU.
- `none`: whole devices, no limits: accounting only.
- `simulated`: no device request at all; the limit variables a `hami` session would see, plus
  `FGPU_SIMULATED=1` and the grant itself as JSON in `FGPU_GRANT`, so a notebook can read what it
  holds. Per device, `FGPU_GPU_UUID_<i>`, `FGPU_GPU_NAME_<i>` and `FGPU_GPU_MEMORY_MIB_<i>` (the
  whole GPU's memory) describe the simulated GPU itself: the images' `nvidia-smi` stand-in
  (image_catalog/recipes/jupyter-base/nvidia_smi.py) prints them next to the slice, which it reads
  from the same limit variables HAMi-core would enforce.

Device index `i` in the HAMi variables is the device's position inside the container. The NVIDIA
runtime shows a container its devices in the host's order (PCI bus order, as NVML lists them), so
pass `gpu_order`, the node's GPU UUIDs in NVML index order, whenever a grant spans several GPUs;
without it the grant's own order is assumed. `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA count the
same way as NVML. `CUDA_VISIBLE_DEVICES` lists container indices in `hami` mode, because HAMi-core
parses it as integers, and UUIDs otherwise.

Whenever no device is requested (simulated, or a grant without GPUs) `NVIDIA_VISIBLE_DEVICES=void`
is set: on a host whose default runtime is NVIDIA's, an image that says
`NVIDIA_VISIBLE_DEVICES=all` would otherwise get every GPU without a grant.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from docker.types import Mount

from fgpu_shared.units import simulated_gpu_name

from .grant import Grant

MODES = ("hami", "mig", "mps", "none", "simulated")
LABEL_GPU_SHARING = "fgpu.gpu_sharing"
MIB = 1024**2

# Where HAMi-core's pieces appear inside the container (HAMi's device plugin uses the same library
# path and lock directory).
HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
HAMI_CACHE_DIR_IN_CONTAINER = "/usr/local/vgpu/cache"
HAMI_CACHE_FILE_IN_CONTAINER = f"{HAMI_CACHE_DIR_IN_CONTAINER}/cudevshr.cache"
HAMI_SHRREG_TOOL_IN_CONTAINER = "/usr/local/vgpu/shrreg-tool"
# Where HAMi-core puts the region when CUDA_DEVICE_MEMORY_SHARED_CACHE is unset
# (MULTIPROCESS_SHARED_REGION_CACHE_DEFAULT).
HAMI_DEFAULT_CACHE_FILE = "/tmp/cudevshr.cache"
PRELOAD_FILE_IN_CONTAINER = "/etc/ld.so.preload"

_SAFE_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class GpuPaths:
    """Host paths the admin configures; the library is a host install the admin provides."""

    hami_library_path: str = "/usr/local/lib/libvgpu.so"
    hami_cache_base: str = "/var/lib/fgpu-hub/vgpu"
    hami_lock_dir: str = "/tmp/vgpulock"
    hami_preload_path: str = "/var/lib/fgpu-hub/ld.so.preload"
    hami_shrreg_tool_path: str = "/usr/local/lib/hami-shrreg-tool"
    mps_pipe_dir: str = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class GpuSettings:
    """Plain data for the container: `env` and `labels` for create, `device_requests` (docker-py
    `DeviceRequest` kwargs), `binds` (docker-py's dict form; the engine creates missing host
    folders) and `mounts` (read-only binds whose host file must exist) for host_config;
    `command_prefix` goes before the session's command (`session_command`)."""

    env: dict[str, str] = field(default_factory=dict)
    device_requests: list[dict] = field(default_factory=list)
    binds: dict[str, dict[str, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    command_prefix: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Slice:
    """One granted GPU as the container sees it."""

    index: int
    uuid: str
    fraction: float
    memory_bytes: int | None


def build_gpu_settings(
    grant: Grant,
    gpu_memory: Mapping[str, int],
    mode: str,
    paths: GpuPaths | None = None,
    gpu_order: Sequence[str] | None = None,
) -> GpuSettings:
    """Container settings that give the session exactly its granted GPU slices in `mode`."""
    if mode not in MODES:
        raise ValueError(f"Unknown gpu_sharing mode {mode!r}; choose one of {', '.join(MODES)}")
    paths = paths or GpuPaths()
    labels = {LABEL_GPU_SHARING: mode}
    if not grant.gpus:
        return GpuSettings(env={"NVIDIA_VISIBLE_DEVICES": "void"}, labels=labels)
    slices = _slices(grant, gpu_memory, gpu_order, need_memory=mode not in ("mig", "none"))
    if mode == "hami":
        return _hami(grant, slices, paths, labels)
    if mode == "mps":
        return _mps(slices, paths, labels)
    if mode == "mig":
        _refuse_all_but_whole_mig_instances(slices)
    if mode in ("mig", "none"):
        return GpuSettings(_visible(slices), [_device_request(slices)], {}, labels)
    return _simulated(grant, slices, labels)


def _slices(
    grant: Grant,
    gpu_memory: Mapping[str, int],
    gpu_order: Sequence[str] | None,
    need_memory: bool,
) -> list[_Slice]:
    """The granted GPUs in container order, refusing anything a limit could not be built from."""
    uuids = list(grant.gpus)
    if gpu_order is not None:
        missing = [uuid for uuid in uuids if uuid not in gpu_order]
        if missing:
            raise ValueError(f"Granted GPUs {missing} are not in the node's GPU order")
        uuids.sort(key=list(gpu_order).index)
    slices = []
    for index, uuid in enumerate(uuids):
        fraction = grant.gpus[uuid]
        if not 0 < fraction <= 1:
            raise ValueError(f"Grant for {uuid} is {fraction!r}; a GPU share must be in (0, 1]")
        if need_memory and not gpu_memory.get(uuid):
            raise ValueError(f"No memory size known for granted GPU {uuid}; cannot size its slice")
        slices.append(_Slice(index, uuid, fraction, gpu_memory.get(uuid)))
    return slices


def _refuse_all_but_whole_mig_instances(slices: list[_Slice]) -> None:
    for s in slices:
        if not s.uuid.startswith("MIG-"):
            raise ValueError(
                f"gpu_sharing is mig, but {s.uuid} is not a MIG instance: label the node's "
                "fgpu.gpus with its MIG- UUIDs (nvidia-smi -L), or a whole card is handed out"
            )
        if s.fraction < 1:
            raise ValueError(
                f"gpu_sharing is mig, but the grant holds {s.fraction:g} of {s.uuid}: a MIG "
                "instance is given whole (FGPU_UNITS_PER_GPU=1 and whole fGPU), never shared"
            )


def _device_request(slices: list[_Slice]) -> dict:
    return {"driver": "nvidia", "device_ids": [s.uuid for s in slices], "capabilities": [["gpu"]]}


def _visible(slices: list[_Slice], by_index: bool = False) -> dict[str, str]:
    """Device selection for real modes; the device request decides, these keep every tool agreeing.

    CUDA_VISIBLE_DEVICES names UUIDs, as NVIDIA recommends under MPS (indices are remapped by the
    MPS server), except for HAMi-core, which parses the variable as integers.
    """
    cuda = [str(s.index) for s in slices] if by_index else [s.uuid for s in slices]
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(s.uuid for s in slices),
        "CUDA_VISIBLE_DEVICES": ",".join(cuda),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def _memory_mib(s: _Slice) -> int:
    """floor(fraction × memory) in whole MiB; at least 1, because 0 means "unlimited" downstream."""
    assert s.memory_bytes is not None
    return max(1, math.floor(s.fraction * s.memory_bytes) // MIB)


def _sm_percent(fraction: float) -> int:
    """The share of SMs as a whole percentage, rounded half up, within 1..100."""
    return min(100, max(1, math.floor(fraction * 100 + 0.5)))


def _hami_limits(slices: list[_Slice]) -> dict[str, str]:
    env = {}
    for s in slices:
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{s.index}"] = f"{_memory_mib(s)}m"
        env[f"CUDA_DEVICE_SM_LIMIT_{s.index}"] = str(_sm_percent(s.fraction))
    return env


def hami_preload_text() -> str:
    """What the host's preload file holds: the library's path inside the container, one a line."""
    return f"{HAMI_LIBRARY_IN_CONTAINER}\n"


def _hami(grant: Grant, slices: list[_Slice], paths: GpuPaths, labels: dict) -> GpuSettings:
    env = {
        **_visible(slices, by_index=True),
        **_hami_limits(slices),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": HAMI_CACHE_FILE_IN_CONTAINER,
    }
    binds = {
        session_cache_dir(paths, grant.session_id): {
            "bind": HAMI_CACHE_DIR_IN_CONTAINER,
            "mode": "rw",
        },
        session_lock_dir(paths, grant.session_id): {"bind": paths.hami_lock_dir, "mode": "rw"},
    }
    mounts = [
        _read_only_file(paths.hami_library_path, HAMI_LIBRARY_IN_CONTAINER),
        _read_only_file(paths.hami_preload_path, PRELOAD_FILE_IN_CONTAINER),
        _read_only_file(paths.hami_shrreg_tool_path, HAMI_SHRREG_TOOL_IN_CONTAINER),
    ]
    return GpuSettings(
        env, [_device_request(slices)], binds, labels, mounts, hami_region_first_prefix()
    )


def hami_region_first_prefix() -> list[str]:
    """A command prefix that creates the session's HAMi-core region from the container's own
    environment (the spawner's limits), then runs the session's command. HAMi-core's default
    region path is made a link to the session's region first, so that a process started with an
    empty environment (`env -i`), which would otherwise create a fresh region without limits
    there, lands in the session's. If a step fails the container exits and the spawn fails: no
    session runs with a region someone else initialised."""
    link = f"ln -sfn {HAMI_CACHE_FILE_IN_CONTAINER} {HAMI_DEFAULT_CACHE_FILE}"
    script = f'{link} && "$0" --create_new && exec "$@"'
    return ["/bin/sh", "-c", script, HAMI_SHRREG_TOOL_IN_CONTAINER]


def session_command(command: Sequence[str], gpu: GpuSettings) -> list[str]:
    """The session's command behind the GPU mode's prefix. A prefix needs a command to hand over
    to: with none, the shell would exit at once, so that is refused."""
    if gpu.command_prefix and not command:
        raise ValueError("This GPU mode needs the session's command; none is configured")
    return [*gpu.command_prefix, *command]


def _read_only_file(source: str, target: str) -> Mount:
    return Mount(target=target, source=source, type="bind", read_only=True)


def session_cache_dir(paths: GpuPaths, session_id: str) -> str:
    """The host directory for one session's HAMi-core cache; the id must not climb out of the base."""
    if not _SAFE_SESSION_ID.match(session_id) or session_id in {".", ".."}:
        raise ValueError(f"Session id {session_id!r} cannot name a cache directory")
    return f"{paths.hami_cache_base.rstrip('/')}/{session_id}"


def session_lock_dir(paths: GpuPaths, session_id: str) -> str:
    """The host folder of one session's HAMi-core lock, in its cache folder: no session can hold
    another's lock."""
    return f"{session_cache_dir(paths, session_id)}/vgpulock"


def _mps(slices: list[_Slice], paths: GpuPaths, labels: dict) -> GpuSettings:
    # One thread percentage covers every device of the client; the smallest share is the fraction.
    share = min(s.fraction for s in slices)
    env = {
        **_visible(slices),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(_sm_percent(share)),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(f"{s.uuid}={_memory_mib(s)}M" for s in slices),
        "CUDA_MPS_PIPE_DIRECTORY": paths.mps_pipe_dir,
    }
    binds = {paths.mps_pipe_dir: {"bind": paths.mps_pipe_dir, "mode": "rw"}}
    return GpuSettings(env, [_device_request(slices)], binds, labels)


def _simulated(grant: Grant, slices: list[_Slice], labels: dict) -> GpuSettings:
    env = {
        "NVIDIA_VISIBLE_DEVICES": "void",
        **_hami_limits(slices),
        "FGPU_SIMULATED": "1",
        "FGPU_GRANT": grant.to_json(),
    }
    for s in slices:
        assert s.memory_bytes is not None
        env[f"FGPU_GPU_UUID_{s.index}"] = s.uuid
        env[f"FGPU_GPU_NAME_{s.index}"] = simulated_gpu_name(s.memory_bytes)
        env[f"FGPU_GPU_MEMORY_MIB_{s.index}"] = str(s.memory_bytes // MIB)
    return GpuSettings(env, [], {}, labels)

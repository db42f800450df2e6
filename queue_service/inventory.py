"""The inventory: which nodes exist, what CPU and memory they offer, and which GPUs they hold.

A node is an explicit dimension from the start (DESIGN.md, "More than one machine"), so the same
`NodeInfo` describes the hub's own Docker host today and a Swarm node tomorrow:

- `discover_local_node` asks the local engine (`docker info`) for CPU and memory, and NVML for
  GPUs, or builds simulated GPUs from an `FGPU_SIMULATED_GPUS` spec on hosts without any;
- `swarm_nodes` reads the same facts out of `docker node inspect`.

Everything except `read_nvml_gpus` and `discover_local_node` is pure, so the scheduler's view of the
cluster can be tested without an engine or a GPU. This module never imports `fgpu_spawner`; it even
keeps its own small size parser so the service stays independent of the spawner.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from image_catalog.units import parse_positive_size, parse_size

# Plausible for a simulated GPU (an A100 has 108 SMs, an RTX 3090 82); nothing depends on it.
SIMULATED_SM_COUNT = 80

# What the hub, the queue service and the proxy keep for themselves on the hub's host.
DEFAULT_RESERVE_CPU = 0.5
DEFAULT_RESERVE_MEM = 1024**3

# Swarm node labels, set with `docker node update --label-add KEY=VALUE NODE`.
LABEL_RESOURCE_GROUP = "fgpu.resource_group"
LABEL_GPU_MEMORY = "fgpu.gpu_memory"
LABEL_GPU_NAME = "fgpu.gpu_name"

# Generic-resource kinds that name GPUs by UUID (`node-generic-resources` in daemon.json).
GPU_RESOURCE_KINDS = {"nvidia-gpu", "gpu"}

_SIM_ITEM_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S.*?)\s*$")


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    name: str
    memory_bytes: int
    sm_count: int
    index: int


@dataclass(frozen=True)
class NodeInfo:
    name: str
    resource_group: str
    cpu: float
    mem: int
    gpus: tuple[GpuInfo, ...]
    simulated: bool


def parse_simulated_gpus(spec: str, node: str) -> tuple[GpuInfo, ...]:
    """GPUs from an `FGPU_SIMULATED_GPUS` spec: "2x8GiB", or a comma list such as "1x8GiB,1x16GiB".

    UUIDs are "GPU-sim-<node>-<index>": stable across restarts, so allocations recorded in the DB
    still point at the same GPU, and plainly fake wherever they show up.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("FGPU_SIMULATED_GPUS is empty; write it like 2x8GiB or 1x8GiB,1x16GiB")
    gpus: list[GpuInfo] = []
    for item in spec.split(","):
        count, size = _parse_simulated_item(item, spec)
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                GpuInfo(
                    uuid=f"GPU-sim-{node}-{index}",
                    name=f"Simulated GPU ({_format_gib(size)})",
                    memory_bytes=size,
                    sm_count=SIMULATED_SM_COUNT,
                    index=index,
                )
            )
    return tuple(gpus)


def _parse_simulated_item(item: str, spec: str) -> tuple[int, int]:
    """One "<count>x<size>" term of a simulated spec, refused with the whole spec in the message."""
    match = _SIM_ITEM_RE.match(item)
    if not match:
        raise ValueError(
            f"FGPU_SIMULATED_GPUS={spec!r}: {item.strip()!r} is not <count>x<size>, e.g. 2x8GiB"
        )
    count, size_text = int(match.group(1)), match.group(2)
    if count < 1:
        raise ValueError(f"FGPU_SIMULATED_GPUS={spec!r}: the GPU count must be at least 1")
    try:
        return count, parse_positive_size(size_text)
    except ValueError as e:
        raise ValueError(f"FGPU_SIMULATED_GPUS={spec!r}: GPU memory {e}") from None


def _format_gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.2f}".rstrip("0").rstrip(".") + " GiB"


def read_nvml_gpus(nvml: Any = None) -> tuple[GpuInfo, ...]:
    """The GPUs this machine's NVIDIA driver reports, in NVML index order.

    Returns () when the NVML library is missing, which is how a host without an NVIDIA driver looks.
    Every other NVML error propagates with a note saying what was being read: a GPU host that cannot
    be read is a fault to fix, not a host without GPUs. `nvml` stands in for the `pynvml` module
    (nvidia-ml-py) in tests.
    """
    nvml = nvml if nvml is not None else importlib.import_module("pynvml")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return ()
    except nvml.NVMLError as e:
        e.add_note("while initialising NVML to list this host's GPUs")
        raise
    # From here on NVML is initialised, so it is shut down whatever happens.
    try:
        return tuple(_read_nvml_gpu(nvml, index) for index in range(nvml.nvmlDeviceGetCount()))
    finally:
        nvml.nvmlShutdown()


def _read_nvml_gpu(nvml: Any, index: int) -> GpuInfo:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return GpuInfo(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            sm_count=_sm_count(nvml, handle),
            index=index,
        )
    except nvml.NVMLError as e:
        e.add_note(f"while reading GPU {index} through NVML")
        raise


def _text(value: str | bytes) -> str:
    """Older NVML bindings return bytes where nvidia-ml-py returns str."""
    return value.decode() if isinstance(value, bytes) else value


def _sm_count(nvml: Any, handle: Any) -> int:
    """NVML has no plain SM-count query; the device attributes carry it where the driver supports
    them. The count is informational only, so 0 stands for "unknown" rather than failing."""
    try:
        return int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
    except (AttributeError, nvml.NVMLError):
        return 0


def node_capacity(
    docker_info: Mapping[str, Any], reserve_cpu: float, reserve_mem: int
) -> tuple[float, int]:
    """(cpu cores, memory bytes) that sessions may use: `docker info`'s NCPU and MemTotal less what
    the host keeps for itself."""
    try:
        ncpu, mem_total = float(docker_info["NCPU"]), int(docker_info["MemTotal"])
    except KeyError as e:
        raise ValueError(f"docker info has no {e.args[0]} field; is this a Docker engine?") from e
    return _less_reserve(ncpu, mem_total, reserve_cpu, reserve_mem, where="this host")


def _less_reserve(
    cpu: float, mem: int, reserve_cpu: float, reserve_mem: int | str, where: str
) -> tuple[float, int]:
    reserve_mem = parse_size(reserve_mem)
    if reserve_cpu < 0:
        raise ValueError(f"The CPU reserve must not be negative (got {reserve_cpu})")
    if cpu - reserve_cpu <= 0:
        raise ValueError(
            f"Reserving {reserve_cpu:g} CPUs leaves nothing for sessions on {where} ({cpu:g} CPUs)"
        )
    if mem - reserve_mem <= 0:
        raise ValueError(
            f"Reserving {reserve_mem} bytes of memory leaves nothing for sessions on {where} "
            f"({mem} bytes)"
        )
    return cpu - reserve_cpu, mem - reserve_mem


def discover_local_node(
    docker_client: Any,
    name: str | None = None,
    resource_group: str = "default",
    simulated_spec: str | None = None,
    reserve_cpu: float = DEFAULT_RESERVE_CPU,
    reserve_mem: int | str = DEFAULT_RESERVE_MEM,
    nvml: Any = None,
) -> NodeInfo:
    """The node behind `docker_client`, with simulated GPUs when `simulated_spec` is given.

    NVML reads the GPUs of the machine this process runs on, so without a simulated spec the client
    must talk to the local engine; remote nodes come from `swarm_nodes` instead.
    """
    info = docker_client.info()
    cpu, mem = node_capacity(info, reserve_cpu, parse_size(reserve_mem))
    node_name = name or info.get("Name") or "local"
    if simulated_spec is not None:
        gpus = parse_simulated_gpus(simulated_spec, node_name)
    else:
        gpus = read_nvml_gpus(nvml)
    return NodeInfo(node_name, resource_group, cpu, mem, gpus, simulated=simulated_spec is not None)


def swarm_nodes(
    node_inspect_list: Iterable[Mapping[str, Any]],
    reserve_cpu: float = 0.0,
    reserve_mem: int | str = 0,
) -> list[NodeInfo]:
    """Nodes that can take new sessions, from `docker node inspect` output (a list of dicts).

    What is read, and the label convention admins follow:

    - name: `Description.Hostname`, so a grant's node becomes the placement constraint
      `node.hostname==<name>`;
    - cpu and mem: `Description.Resources.NanoCPUs` / 1e9 and `.MemoryBytes`, less the reserves;
    - GPUs: `Description.Resources.GenericResources` entries with a `NamedResourceSpec` of kind
      "NVIDIA-GPU" or "gpu" (case-insensitive), whose values are GPU UUIDs. The engine advertises them
      through `node-generic-resources` in daemon.json, e.g. `["NVIDIA-GPU=GPU-1f2e..."]`. GPUs
      advertised only as a count (`DiscreteResourceSpec`) are refused: a grant must name its GPUs;
    - node labels (`docker node update --label-add`, found under `Spec.Labels`):
      - `fgpu.resource_group`: the node's resource group (default "default");
      - `fgpu.gpu_memory`: memory per GPU, in bytes or as a size like "16GiB"; required on a node
        with GPUs, because every fGPU slice is sized from it;
      - `fgpu.gpu_name`: optional, a model name to show (default "NVIDIA GPU").

    Nodes that are not `ready` or not `active` (drained or paused) are left out, since Swarm would
    not place a new session there. NVML is not read for Swarm nodes, so their SM count is 0.
    """
    nodes = []
    for node in node_inspect_list:
        if not _schedulable(node):
            continue
        nodes.append(_swarm_node(node, reserve_cpu, reserve_mem))
    return nodes


def _schedulable(node: Mapping[str, Any]) -> bool:
    state = (node.get("Status") or {}).get("State")
    availability = (node.get("Spec") or {}).get("Availability")
    return state == "ready" and availability == "active"


def _swarm_node(node: Mapping[str, Any], reserve_cpu: float, reserve_mem: int | str) -> NodeInfo:
    description = node.get("Description") or {}
    resources = description.get("Resources") or {}
    labels = (node.get("Spec") or {}).get("Labels") or {}
    name = description.get("Hostname") or node.get("ID")
    if not name:
        raise ValueError("A Swarm node has neither a hostname nor an ID")
    cpu, mem = _less_reserve(
        int(resources.get("NanoCPUs", 0)) / 1e9,
        int(resources.get("MemoryBytes", 0)),
        reserve_cpu,
        reserve_mem,
        where=f"Swarm node {name}",
    )
    uuids = _swarm_gpu_uuids(name, resources.get("GenericResources") or [])
    gpus = _swarm_gpus(name, uuids, labels)
    group = labels.get(LABEL_RESOURCE_GROUP) or "default"
    return NodeInfo(name, group, cpu, mem, gpus, simulated=False)


def _swarm_gpu_uuids(node_name: str, generic_resources: Iterable[Mapping[str, Any]]) -> list[str]:
    uuids = []
    for resource in generic_resources:
        named = resource.get("NamedResourceSpec")
        discrete = resource.get("DiscreteResourceSpec")
        if named and str(named.get("Kind", "")).lower() in GPU_RESOURCE_KINDS:
            uuids.append(str(named["Value"]))
        elif discrete and str(discrete.get("Kind", "")).lower() in GPU_RESOURCE_KINDS:
            raise ValueError(
                f"Swarm node {node_name} advertises its GPUs as a count "
                f"({discrete.get('Kind')}={discrete.get('Value')}); advertise each GPU by UUID "
                "in node-generic-resources, e.g. NVIDIA-GPU=GPU-<uuid>"
            )
    return uuids


def _swarm_gpus(node_name: str, uuids: list[str], labels: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    if not uuids:
        return ()
    if LABEL_GPU_MEMORY not in labels:
        raise ValueError(
            f"Swarm node {node_name} has GPUs but no {LABEL_GPU_MEMORY} label; add it with "
            f"`docker node update --label-add {LABEL_GPU_MEMORY}=16GiB {node_name}`"
        )
    try:
        memory = parse_size(labels[LABEL_GPU_MEMORY])
    except ValueError as e:
        raise ValueError(f"Swarm node {node_name}, label {LABEL_GPU_MEMORY}: {e}") from None
    name = labels.get(LABEL_GPU_NAME) or "NVIDIA GPU"
    return tuple(GpuInfo(uuid, name, memory, 0, index) for index, uuid in enumerate(uuids))

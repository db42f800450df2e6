"""The inventory: which nodes exist, what CPU and memory they offer, and which GPUs they hold.

A node is an explicit dimension from the start (docs/source/explanation/architecture.md, "More than one machine"), so the same
`NodeInfo` describes the hub's own Docker host today and a Swarm node tomorrow:

- `discover_local_node` asks the local engine (`docker info`) for CPU and memory, and NVML for
  GPUs, or builds simulated GPUs from an `FGPU_SIMULATED_GPUS` spec on hosts without any;
- `swarm_nodes` reads the same facts out of `docker node inspect`: CPU and memory from the node's
  description, GPUs and overrides from node labels (never from Swarm generic resources).

Everything except `read_nvml_gpus` and `discover_local_node` is pure, so the scheduler's view of the
cluster can be tested without an engine or a GPU. This module never imports `fgpu_spawner`; it even
keeps its own small size parser so the service stays independent of the spawner.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fgpu_shared.units import parse_positive_size, parse_size, simulated_gpu_name

# Plausible for a simulated GPU (an A100 has 108 SMs, an RTX 3090 82); nothing depends on it.
SIMULATED_SM_COUNT = 80

# What the hub, the queue service and the proxy keep for themselves on the hub's host.
DEFAULT_RESERVE_CPU = 0.5
DEFAULT_RESERVE_MEM = 1024**3

# Swarm node labels, set with `docker node update --label-add KEY=VALUE NODE` (see `swarm_nodes`).
LABEL_RESOURCE_GROUP = "fgpu.resource_group"
LABEL_ROLE = "fgpu.role"
LABEL_SIMULATED_GPUS = "fgpu.simulated_gpus"
LABEL_GPUS = "fgpu.gpus"
LABEL_GPU_MEMORY = "fgpu.gpu_memory"
LABEL_GPU_NAME = "fgpu.gpu_name"
LABEL_CPU = "fgpu.cpu"
LABEL_MEM = "fgpu.mem"
# A node with this role label runs the Swarm (the lab's drained manager), never sessions.
ROLE_MANAGER = "manager"

# Generic-resource kinds that name GPUs (`node-generic-resources` in daemon.json). They are only
# looked for to refuse them: see `swarm_nodes`.
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


def parse_simulated_gpus(
    spec: str, node: str, source: str = "FGPU_SIMULATED_GPUS"
) -> tuple[GpuInfo, ...]:
    """GPUs from an `FGPU_SIMULATED_GPUS` spec: "2x8GiB", or a comma list such as "1x8GiB,1x16GiB".

    UUIDs are "GPU-sim-<node>-<index>": stable across restarts, so allocations recorded in the DB
    still point at the same GPU, distinct from node to node, and plainly fake wherever they show
    up. `source` names where the spec came from in error messages (a variable, a node label).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{source} is empty; write it like 2x8GiB or 1x8GiB,1x16GiB")
    gpus: list[GpuInfo] = []
    for item in spec.split(","):
        count, size = _parse_simulated_item(item, spec, source)
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                GpuInfo(
                    uuid=f"GPU-sim-{node}-{index}",
                    name=simulated_gpu_name(size),
                    memory_bytes=size,
                    sm_count=SIMULATED_SM_COUNT,
                    index=index,
                )
            )
    return tuple(gpus)


def _parse_simulated_item(item: str, spec: str, source: str) -> tuple[int, int]:
    """One "<count>x<size>" term of a simulated spec, refused with the whole spec in the message."""
    match = _SIM_ITEM_RE.match(item)
    if not match:
        raise ValueError(f"{source}={spec!r}: {item.strip()!r} is not <count>x<size>, e.g. 2x8GiB")
    count, size_text = int(match.group(1)), match.group(2)
    if count < 1:
        raise ValueError(f"{source}={spec!r}: the GPU count must be at least 1")
    try:
        return count, parse_positive_size(size_text)
    except ValueError as e:
        raise ValueError(f"{source}={spec!r}: GPU memory {e}") from None


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

    GPUs are never Swarm generic resources: a swarmkit bug rejects running tasks that hold them on
    any node update ("assigned node no longer meets constraints"), so the queue service accounts
    for GPUs itself and this reads them from node labels. What is read:

    - name: `Description.Hostname`, so a grant's node becomes the placement constraint
      `node.hostname==<name>`;
    - cpu and mem: `Description.Resources.NanoCPUs` / 1e9 and `.MemoryBytes`, less the reserves;
    - node labels (`docker node update --label-add`, found under `Spec.Labels`):
      - `fgpu.resource_group`: the node's resource group (default "default");
      - `fgpu.cpu`, `fgpu.mem`: what sessions may use on this node (cores; bytes or a size such as
        "16G"), in place of what the engine reports less the reserve. In the lab every node sees
        the whole machine, so these split it; more than the node reports is refused, since Swarm
        would never place a task reserving it;
      - `fgpu.simulated_gpus`: simulated GPUs, the same spec as `FGPU_SIMULATED_GPUS` (e.g.
        "1x8GiB"); their UUIDs are "GPU-sim-<hostname>-<index>" and the node is `simulated`;
      - `fgpu.gpus`: real GPUs by UUID, comma-separated ("GPU-1f2e...,GPU-9a8b..."), with
        `fgpu.gpu_memory` (memory per GPU, bytes or a size like "40GiB"; required, every fGPU
        slice is sized from it) and optionally `fgpu.gpu_name` (default "NVIDIA GPU"). An admin
        sets these today; the node agent (node_agent/agent.py) reads NVML on each node and report the
        real GPUs instead;
      - `fgpu.role=manager`: a node that runs the Swarm, not sessions (the lab's manager).

    Nodes that are not `ready` or not `active` (drained or paused) are left out, since Swarm would
    not place a new session there. A bad label, or a node still advertising GPUs as generic
    resources, raises ValueError naming the node, the label and the fix. NVML is not read for
    Swarm nodes, so a real GPU's SM count is 0 (unknown).
    """
    nodes = [
        _swarm_node(node, reserve_cpu, reserve_mem)
        for node in node_inspect_list
        if _schedulable(node) and _labels(node).get(LABEL_ROLE) != ROLE_MANAGER
    ]
    _refuse_shared_gpus(nodes)
    return nodes


def _refuse_shared_gpus(nodes: list[NodeInfo]) -> None:
    """A GPU UUID on two nodes (a label copied by mistake) would let two grants share one GPU."""
    seen: dict[str, str] = {}
    for node in nodes:
        for gpu in node.gpus:
            if gpu.uuid in seen:
                raise ValueError(
                    f"GPU {gpu.uuid} is labelled on Swarm nodes {seen[gpu.uuid]} and {node.name}; "
                    f"fix the {LABEL_GPUS} label of one of them"
                )
            seen[gpu.uuid] = node.name


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("Spec") or {}).get("Labels") or {}


def _schedulable(node: Mapping[str, Any]) -> bool:
    state = (node.get("Status") or {}).get("State")
    availability = (node.get("Spec") or {}).get("Availability")
    return state == "ready" and availability == "active"


def _swarm_node(node: Mapping[str, Any], reserve_cpu: float, reserve_mem: int | str) -> NodeInfo:
    description = node.get("Description") or {}
    resources = description.get("Resources") or {}
    labels = _labels(node)
    name = description.get("Hostname") or node.get("ID")
    if not name:
        raise ValueError("A Swarm node has neither a hostname nor an ID")
    _refuse_generic_gpus(name, resources.get("GenericResources") or [])
    cpu, mem = _swarm_capacity(name, resources, labels, reserve_cpu, reserve_mem)
    simulated = LABEL_SIMULATED_GPUS in labels
    gpus = _simulated_label_gpus(name, labels) if simulated else _real_label_gpus(name, labels)
    group = labels.get(LABEL_RESOURCE_GROUP) or "default"
    return NodeInfo(name, group, cpu, mem, gpus, simulated=simulated)


def _swarm_capacity(
    name: str,
    resources: Mapping[str, Any],
    labels: Mapping[str, str],
    reserve_cpu: float,
    reserve_mem: int | str,
) -> tuple[float, int]:
    """(cpu, mem) for sessions: the engine's figures less the reserves, or the label overrides."""
    reported_cpu = int(resources.get("NanoCPUs", 0)) / 1e9
    reported_mem = int(resources.get("MemoryBytes", 0))
    cpu, mem = _less_reserve(
        reported_cpu, reported_mem, reserve_cpu, reserve_mem, where=f"Swarm node {name}"
    )
    if LABEL_CPU in labels:
        cpu = _label_value(name, labels, LABEL_CPU, _positive_cores, "4 or 2.5", reported_cpu)
    if LABEL_MEM in labels:
        mem = _label_value(name, labels, LABEL_MEM, parse_positive_size, "16G", reported_mem)
    return cpu, mem


def _positive_cores(text: str) -> float:
    try:
        cores = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of cores") from None
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"must be a number of cores greater than zero, not {text!r}")
    return cores


def _label_value(
    name: str,
    labels: Mapping[str, str],
    key: str,
    parse: Callable[[str], float],
    example: str,
    most: float | None = None,
) -> Any:
    """A label parsed by `parse`, refused with the node, the label and an example of a good value."""
    try:
        value = parse(labels[key])
    except ValueError as e:
        raise ValueError(
            f"Swarm node {name}, label {key}={labels[key]!r}: {e}; set it like "
            f"`docker node update --label-add {key}={example} {name}`"
        ) from None
    if most is not None and value > most:
        raise ValueError(
            f"Swarm node {name}, label {key}={labels[key]!r}: more than the node has "
            f"({most:g}); Swarm would never place a session reserving it"
        )
    return value


def _refuse_generic_gpus(name: str, generic_resources: Iterable[Mapping[str, Any]]) -> None:
    """A node advertising GPUs as generic resources is misconfigured: using them would bring back
    the swarmkit bug, and ignoring them would hide GPUs the admin meant to offer."""
    for resource in generic_resources:
        spec = resource.get("NamedResourceSpec") or resource.get("DiscreteResourceSpec") or {}
        if str(spec.get("Kind", "")).lower() in GPU_RESOURCE_KINDS:
            raise ValueError(
                f"Swarm node {name} advertises GPUs as Swarm generic resources "
                f"({spec.get('Kind')}={spec.get('Value')}); a swarmkit bug rejects running tasks "
                "that hold them on any node update. Remove node-generic-resources from that "
                f"node's daemon.json and label the node instead: {LABEL_GPUS}=GPU-<uuid>,... "
                f"with {LABEL_GPU_MEMORY}=<size>"
            )


def _simulated_label_gpus(name: str, labels: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    if LABEL_GPUS in labels:
        raise ValueError(
            f"Swarm node {name} has both {LABEL_SIMULATED_GPUS} and {LABEL_GPUS} labels; "
            "a node's GPUs are either simulated or real"
        )
    source = f"Swarm node {name}, label {LABEL_SIMULATED_GPUS}"
    return parse_simulated_gpus(labels[LABEL_SIMULATED_GPUS], node=name, source=source)


def _real_label_gpus(name: str, labels: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    uuids = [uuid.strip() for uuid in labels.get(LABEL_GPUS, "").split(",") if uuid.strip()]
    if not uuids:
        return ()
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"Swarm node {name}, label {LABEL_GPUS}: a GPU UUID is listed twice")
    if LABEL_GPU_MEMORY not in labels:
        raise ValueError(
            f"Swarm node {name} has GPUs but no {LABEL_GPU_MEMORY} label; add it with "
            f"`docker node update --label-add {LABEL_GPU_MEMORY}=16GiB {name}`"
        )
    memory = _label_value(name, labels, LABEL_GPU_MEMORY, parse_positive_size, "16GiB")
    gpu_name = labels.get(LABEL_GPU_NAME) or "NVIDIA GPU"
    return tuple(GpuInfo(uuid, gpu_name, memory, 0, index) for index, uuid in enumerate(uuids))

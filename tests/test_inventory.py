from types import SimpleNamespace

import docker
import pynvml
import pytest

from queue_service.engine.inventory import (
    GpuInfo,
    NodeInfo,
    discover_local_node,
    node_capacity,
    parse_simulated_gpus,
    read_nvml_gpus,
    swarm_nodes,
)

GIB = 1024**3


# --- simulated GPUs -------------------------------------------------------------------------------


def test_simulated_spec_gives_stable_readable_gpus():
    gpus = parse_simulated_gpus("2x8GiB", node="vm")
    assert gpus == (
        GpuInfo("GPU-sim-vm-0", "Simulated GPU (8 GiB)", 8 * GIB, 80, 0),
        GpuInfo("GPU-sim-vm-1", "Simulated GPU (8 GiB)", 8 * GIB, 80, 1),
    )
    assert parse_simulated_gpus("2x8GiB", node="vm") == gpus


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("1x16G", [16 * GIB]),
        ("1x16384M", [16 * GIB]),
        ("1x8GiB,1x16GiB", [8 * GIB, 16 * GIB]),
        (" 2 x 8GB , 1x1.5G ", [8 * GIB, 8 * GIB, int(1.5 * GIB)]),
    ],
)
def test_simulated_spec_sizes_are_binary_like_docker(spec, sizes):
    gpus = parse_simulated_gpus(spec, node="n1")
    assert [g.memory_bytes for g in gpus] == sizes
    assert [g.index for g in gpus] == list(range(len(sizes)))
    assert [g.uuid for g in gpus] == [f"GPU-sim-n1-{i}" for i in range(len(sizes))]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0x8GiB", "count must be at least 1"),
        ("2x", "is not <count>x<size>"),
        ("x8G", "is not <count>x<size>"),
        ("2x-1G", "is not a size"),
        ("2x0G", "GPU memory must be greater than zero"),
        ("lots of GPUs", "is not <count>x<size>"),
        ("2x8GiB,", "is not <count>x<size>"),
        ("", "is empty"),
    ],
)
def test_bad_simulated_specs_are_refused_with_a_clear_message(spec, message):
    with pytest.raises(ValueError, match=message) as raised:
        parse_simulated_gpus(spec, node="vm")
    assert "FGPU_SIMULATED_GPUS" in str(raised.value)


# --- NVML boundary --------------------------------------------------------------------------------


class FakeNvml:
    """Mimics the pynvml functions inventory uses, with pynvml's own error classes."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound

    def __init__(self, gpus=(), init_error=None, fail_on_index=None, attributes=True):
        self.gpus = list(gpus)
        self.init_error = init_error
        self.fail_on_index = fail_on_index
        self.calls = []
        if attributes:  # old bindings lack the call
            self.nvmlDeviceGetAttributes = self._attributes

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index == self.fail_on_index:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=handle["memory"], free=handle["memory"], used=0)

    def _attributes(self, handle):
        if handle["sm"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=handle["sm"])


TWO_GPUS = [
    {"uuid": b"GPU-1111", "name": b"NVIDIA A100-SXM4-40GB", "memory": 40 * GIB, "sm": 108},
    {"uuid": "GPU-2222", "name": "NVIDIA A100-SXM4-40GB", "memory": 40 * GIB, "sm": None},
]


def test_nvml_gpus_are_read_with_bytes_or_str_answers():
    nvml = FakeNvml(TWO_GPUS)
    assert read_nvml_gpus(nvml) == (
        GpuInfo("GPU-1111", "NVIDIA A100-SXM4-40GB", 40 * GIB, 108, 0),
        GpuInfo("GPU-2222", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, 1),
    )
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_without_the_attributes_call_reports_sm_count_zero():
    nvml = FakeNvml(TWO_GPUS[:1], attributes=False)
    assert read_nvml_gpus(nvml)[0].sm_count == 0


def test_a_host_without_the_nvml_library_has_no_gpus():
    nvml = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound())
    assert read_nvml_gpus(nvml) == ()
    # Nothing was initialised, so there is nothing to shut down.
    assert nvml.calls == ["init"]


def test_other_nvml_errors_at_init_propagate_with_context():
    nvml = FakeNvml(init_error=pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded) as raised:
        read_nvml_gpus(nvml)
    assert any("initialising NVML" in note for note in raised.value.__notes__)


def test_an_nvml_error_while_reading_propagates_and_nvml_is_still_shut_down():
    nvml = FakeNvml(TWO_GPUS, fail_on_index=1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as raised:
        read_nvml_gpus(nvml)
    assert any("GPU 1" in note for note in raised.value.__notes__)
    assert nvml.calls == ["init", "shutdown"]


def test_real_nvml_on_this_gpu_less_host_finds_no_gpus():
    assert read_nvml_gpus() == ()


# --- capacity -------------------------------------------------------------------------------------


def test_node_capacity_is_docker_info_less_the_reserve():
    info = {"NCPU": 16, "MemTotal": 64 * GIB, "Name": "gpu1"}
    assert node_capacity(info, reserve_cpu=1.5, reserve_mem=4 * GIB) == (14.5, 60 * GIB)
    assert node_capacity(info, reserve_cpu=0, reserve_mem=0) == (16.0, 64 * GIB)


@pytest.mark.parametrize(
    ("reserve_cpu", "reserve_mem", "message"),
    [(2, 0, "CPUs leaves nothing"), (0.5, 4 * GIB, "memory leaves nothing"), (-1, 0, "negative")],
)
def test_a_reserve_that_leaves_nothing_is_refused(reserve_cpu, reserve_mem, message):
    with pytest.raises(ValueError, match=message):
        node_capacity({"NCPU": 2, "MemTotal": 4 * GIB}, reserve_cpu, reserve_mem)


def test_docker_info_without_the_fields_is_refused():
    with pytest.raises(ValueError, match="NCPU"):
        node_capacity({"MemTotal": GIB}, 0, 0)


class FakeDocker:
    def info(self):
        return {"NCPU": 8, "MemTotal": 32 * GIB, "Name": "box"}


def test_discover_local_node_uses_nvml_without_a_simulated_spec():
    node = discover_local_node(
        FakeDocker(), reserve_cpu=1, reserve_mem="2G", nvml=FakeNvml(TWO_GPUS)
    )
    assert (node.name, node.cpu, node.mem, node.simulated) == ("box", 7.0, 30 * GIB, False)
    assert [g.uuid for g in node.gpus] == ["GPU-1111", "GPU-2222"]


def test_discover_local_node_prefers_the_simulated_spec_and_names():
    node = discover_local_node(
        FakeDocker(), name="lab", resource_group="teaching", simulated_spec="1x16GiB"
    )
    assert node.simulated is True
    assert node.resource_group == "teaching"
    assert node.gpus == (GpuInfo("GPU-sim-lab-0", "Simulated GPU (16 GiB)", 16 * GIB, 80, 0),)


@pytest.mark.docker
def test_discover_local_node_against_the_real_engine():
    node = discover_local_node(docker.from_env(), simulated_spec="2x8GiB")
    assert node.cpu > 0
    assert node.mem > 0
    assert node.simulated is True
    assert len(node.gpus) == 2
    assert all(g.memory_bytes == 8 * GIB for g in node.gpus)
    assert node.gpus[0].uuid == f"GPU-sim-{node.name}-0"


# --- Swarm ----------------------------------------------------------------------------------------


def swarm_node(hostname, state="ready", availability="active", labels=None, generic=None):
    """A `docker node inspect` record as dockerd 20.10 returns it (trimmed of unread fields)."""
    return {
        "ID": f"id-{hostname}",
        "Version": {"Index": 42},
        "CreatedAt": "2024-05-01T09:00:00Z",
        "Spec": {"Labels": labels or {}, "Role": "worker", "Availability": availability},
        "Description": {
            "Hostname": hostname,
            "Platform": {"Architecture": "x86_64", "OS": "linux"},
            "Resources": {
                "NanoCPUs": 32_000_000_000,
                "MemoryBytes": 128 * GIB,
                **({"GenericResources": generic} if generic is not None else {}),
            },
            "Engine": {"EngineVersion": "20.10.24", "Plugins": []},
        },
        "Status": {"State": state, "Addr": "10.0.0.7"},
    }


def named_gpu(uuid, kind="NVIDIA-GPU"):
    return {"NamedResourceSpec": {"Kind": kind, "Value": uuid}}


def test_swarm_nodes_read_capacity_real_gpus_and_labels():
    inspect = [
        swarm_node(
            "gpu1",
            labels={
                "fgpu.resource_group": "a100",
                "fgpu.gpus": "GPU-aaaa, GPU-bbbb",
                "fgpu.gpu_memory": "40GiB",
                "fgpu.gpu_name": "A100",
            },
            # Generic resources that are not GPUs stay Swarm's business.
            generic=[{"DiscreteResourceSpec": {"Kind": "SSD", "Value": 2}}],
        ),
        swarm_node("cpu1"),
    ]
    assert swarm_nodes(inspect, reserve_cpu=2, reserve_mem=8 * GIB) == [
        NodeInfo(
            "gpu1",
            "a100",
            30.0,
            120 * GIB,
            (
                GpuInfo("GPU-aaaa", "A100", 40 * GIB, 0, 0),
                GpuInfo("GPU-bbbb", "A100", 40 * GIB, 0, 1),
            ),
            simulated=False,
        ),
        NodeInfo("cpu1", "default", 30.0, 120 * GIB, (), simulated=False),
    ]


def test_swarm_gpu_memory_label_accepts_bytes():
    labels = {"fgpu.gpus": "GPU-x", "fgpu.gpu_memory": str(16 * GIB)}
    [node] = swarm_nodes([swarm_node("g", labels=labels)])
    assert node.gpus[0].memory_bytes == 16 * GIB
    assert node.gpus[0].name == "NVIDIA GPU"


def test_swarm_simulated_gpus_label_gives_stable_gpus_distinct_per_node():
    """The lab labels every worker with the same spec; the UUIDs must still differ per node."""
    labels = {"fgpu.simulated_gpus": "1x8GiB", "fgpu.resource_group": "default"}
    inspect = [swarm_node("fgpu-lab-1", labels=labels), swarm_node("fgpu-lab-2", labels=labels)]
    nodes = swarm_nodes(inspect)
    assert [(n.name, n.simulated) for n in nodes] == [("fgpu-lab-1", True), ("fgpu-lab-2", True)]
    assert [n.gpus for n in nodes] == [
        parse_simulated_gpus("1x8GiB", node="fgpu-lab-1"),
        parse_simulated_gpus("1x8GiB", node="fgpu-lab-2"),
    ]
    assert [g.uuid for n in nodes for g in n.gpus] == [
        "GPU-sim-fgpu-lab-1-0",
        "GPU-sim-fgpu-lab-2-0",
    ]
    assert swarm_nodes(inspect) == nodes


def test_swarm_capacity_labels_override_what_the_node_reports():
    labels = {"fgpu.cpu": "2.5", "fgpu.mem": "6G"}
    [node] = swarm_nodes([swarm_node("n", labels=labels)], reserve_cpu=1, reserve_mem=GIB)
    # The labels say what sessions get there; the reserve applies only to the engine's figures.
    assert (node.cpu, node.mem) == (2.5, 6 * GIB)
    [only_cpu] = swarm_nodes([swarm_node("n", labels={"fgpu.cpu": "4"})], reserve_mem=GIB)
    assert (only_cpu.cpu, only_cpu.mem) == (4.0, 127 * GIB)


def test_swarm_manager_role_and_unschedulable_nodes_are_left_out():
    inspect = [
        swarm_node("manager", labels={"fgpu.role": "manager"}),
        swarm_node("down", state="down"),
        swarm_node("drained", availability="drain"),
        swarm_node("paused", availability="pause"),
        swarm_node("ok", labels={"fgpu.role": "worker"}),
    ]
    assert [n.name for n in swarm_nodes(inspect)] == ["ok"]


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"fgpu.simulated_gpus": "2x"}, "node n1, label fgpu.simulated_gpus='2x'"),
        ({"fgpu.simulated_gpus": ""}, "node n1, label fgpu.simulated_gpus is empty"),
        ({"fgpu.simulated_gpus": "0x8G"}, "label fgpu.simulated_gpus='0x8G': the GPU count"),
        ({"fgpu.gpus": "GPU-a"}, "n1 has GPUs but no fgpu.gpu_memory"),
        ({"fgpu.gpus": "GPU-a", "fgpu.gpu_memory": "lots"}, "n1, label fgpu.gpu_memory='lots'"),
        ({"fgpu.gpus": "GPU-a", "fgpu.gpu_memory": "0"}, "label fgpu.gpu_memory='0'"),
        ({"fgpu.gpus": "GPU-a,GPU-a", "fgpu.gpu_memory": "8G"}, "n1, label fgpu.gpus: .*twice"),
        (
            {"fgpu.gpus": "GPU-a", "fgpu.gpu_memory": "8G", "fgpu.simulated_gpus": "1x8G"},
            "n1 has both fgpu.simulated_gpus and fgpu.gpus",
        ),
        ({"fgpu.cpu": "four"}, "n1, label fgpu.cpu='four': 'four' is not a number of cores"),
        ({"fgpu.cpu": "0"}, "n1, label fgpu.cpu='0': must be .* greater than zero"),
        ({"fgpu.cpu": "nan"}, "n1, label fgpu.cpu='nan'"),
        ({"fgpu.cpu": "33"}, "n1, label fgpu.cpu='33': more than the node has \\(32\\)"),
        ({"fgpu.mem": "1.5 gigs"}, "n1, label fgpu.mem='1.5 gigs'"),
        ({"fgpu.mem": "129G"}, "n1, label fgpu.mem='129G': more than the node has"),
    ],
)
def test_bad_swarm_node_labels_are_refused_naming_node_and_label(labels, message):
    with pytest.raises(ValueError, match=message):
        swarm_nodes([swarm_node("ok"), swarm_node("n1", labels=labels)])


def test_a_node_advertising_gpus_as_generic_resources_is_refused_not_used():
    """GPUs as Swarm generic resources trip a swarmkit bug; the admin must hear about it."""
    for generic in (
        [named_gpu("GPU-a")],
        [named_gpu("GPU-a", kind="gpu")],
        [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 2}}],
    ):
        labels = {"fgpu.gpus": "GPU-a", "fgpu.gpu_memory": "8G"}
        with pytest.raises(ValueError, match="gpu1 advertises GPUs as Swarm generic resources"):
            swarm_nodes([swarm_node("gpu1", labels=labels, generic=generic)])


def test_one_gpu_uuid_on_two_nodes_is_refused():
    labels = {"fgpu.gpus": "GPU-a", "fgpu.gpu_memory": "8G"}
    with pytest.raises(ValueError, match="GPU-a is labelled on Swarm nodes g1 and g2"):
        swarm_nodes([swarm_node("g1", labels=labels), swarm_node("g2", labels=labels)])

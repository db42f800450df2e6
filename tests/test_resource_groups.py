"""fgpu_spawner.resource_groups: the groups a user may pick, with what is free in each (pure; the
service's api/resources answer is the input)."""

from __future__ import annotations

from fgpu_spawner.resource_groups import GroupOffer, offered_groups

GIB = 1024**3


def group(allowed: bool, cpu=12.0, mem=40 * GIB, fgpu=3.0, capacity_fgpu=4) -> dict:
    return {
        "allocated": {"cpu": 0, "mem": 0, "fgpu": 0},
        "allocatable": {"cpu": cpu, "mem": mem, "fgpu": fgpu},
        "capacity": {"cpu": 16.0, "mem": 64 * GIB, "fgpu": capacity_fgpu},
        "allowed": allowed,
    }


RESOURCES = {
    "resource_groups": {
        "gpu-a100": group(True),
        "vip": group(False, fgpu=0),
        "cpu-only": group(True, cpu=2.5, mem=int(7.84 * GIB), fgpu=0, capacity_fgpu=0),
    }
}


def test_only_the_groups_the_user_may_use_are_offered_in_the_services_order():
    offers = offered_groups(RESOURCES)
    assert [offer.name for offer in offers] == ["gpu-a100", "cpu-only"]
    assert offers[0] == GroupOffer("gpu-a100", 12.0, 40 * GIB, 3.0, has_gpus=True)


def test_the_label_says_what_is_free_and_mentions_fgpu_only_where_there_are_gpus():
    gpu, cpu_only = offered_groups(RESOURCES)
    assert gpu.label == "gpu-a100 — 3 fGPU, 12 CPU, 40 GiB free"
    assert cpu_only.label == "cpu-only — 2.5 CPU, 7.84 GiB free"


def test_nothing_free_shows_as_zero_never_negative():
    # A quota already passed leaves negative headroom in the service's sums.
    (offer,) = offered_groups({"resource_groups": {"g": group(True, cpu=-1, mem=-5, fgpu=-0.5)}})
    assert offer.free_text == "0 fGPU, 0 CPU, 0 B free"

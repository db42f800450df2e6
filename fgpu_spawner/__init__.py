"""The fGPU spawner: a DockerSpawner that gives each session exactly the slice it asked for, on
one engine (`FGPUSpawner`) or on a Docker Swarm (`FGPUSwarmSpawner`)."""

from .spawner import FGPUSpawner
from .swarm_spawner import FGPUSwarmSpawner

__all__ = ["FGPUSpawner", "FGPUSwarmSpawner"]

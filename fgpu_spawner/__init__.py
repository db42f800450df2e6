"""The fGPU spawner: a DockerSpawner that gives each session exactly the slice it asked for."""

from .spawner import FGPUSpawner

__all__ = ["FGPUSpawner"]

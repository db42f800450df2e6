"""The resource model's values and units: slots, GPU quanta."""

from __future__ import annotations

from queue_service.core.resource_model import QUANTA_PER_GPU, Slots, gpu_quanta

from .core_values import GIB


def test_slots_arithmetic_and_fit():
    a, b = Slots(1.5, GIB, 0.5), Slots(0.5, GIB, 0.25)
    assert a + b == Slots(2.0, 2 * GIB, 0.75)
    assert a - b == Slots(1.0, 0, 0.25)
    assert Slots(0.1 + 0.2, 1, 0.3).fits_in(Slots(0.3, 1, 0.1 + 0.2))
    assert not Slots(0.301, 1, 0).fits_in(Slots(0.3, 1, 0))


def test_gpu_quanta_round_and_never_vanish():
    assert gpu_quanta(1, 2) == QUANTA_PER_GPU // 2
    assert gpu_quanta(0.4, 1) == 4000
    assert gpu_quanta(1e-9, 1) == 1
    assert gpu_quanta(0, 1) == 0

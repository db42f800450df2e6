"""Placement on its own: the shortcuts a pass takes for speed (P1) answer as the long way does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queue_service.core.placement import _NodeState, _slices_on_node
from queue_service.core.resource_model import QUANTA_PER_GPU, Gpu, Node, Slots, _Need

from .core_values import GIB


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(
        st.sampled_from([0, 1, 1000, 2500, 4999, 5000, 9999, QUANTA_PER_GPU]), max_size=6
    ),
    fgpu=st.sampled_from([0.1, 0.25, 0.5, 0.9999, 1, 1.2, 1.5, 2, 2.5, 3, 4.5]),
    units=st.sampled_from([1, 2, 5]),
)
def test_a_nodes_gpu_counts_tell_whether_its_gpus_hold_a_request(free, fgpu, units):
    """`holds_gpus` (two counts) says what `_slices_on_node` (a walk over the GPUs) finds."""
    need = _Need(Slots(1.0, GIB, fgpu), units)
    gpus = tuple(Gpu(f"g{i}") for i in range(len(free)))
    state = _NodeState(0, Node("n", "default", 8.0, 8 * GIB, gpus), 8000, 8 * GIB, list(free))
    slices = _slices_on_node(state.free, need)
    assert state.holds_gpus(need) == (slices is not None)

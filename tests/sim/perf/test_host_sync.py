"""A synchronous step's host time: launches overlap the kernels they launch."""

from __future__ import annotations

import pytest

from sim.perf.host import HostCost, step_time_s


def test_a_synchronous_eager_step_waits_for_one_launch_not_all_of_them() -> None:
    """100 kernels of 100 us launched eagerly at 78 us each: the GPU starts after the first launch and
    never waits again (each launch is shorter than the kernel before it), so the step is the CPU's
    scheduling, one launch and 10 ms of kernels, not 10 ms plus 7.8 ms of launches (before
    2026-12-02, up to 2x on SGLang and TensorRT-LLM prompt steps run without async scheduling)."""
    eager = HostCost(cpu_s=0.2e-3, launch_s=100 * 78e-6, launch_floor_s=0.0, serial_launch_s=78e-6)
    assert step_time_s(device_s=10e-3, host=eager, async_scheduling=False) == pytest.approx(0.2e-3 + 78e-6 + 10e-3)
    # Launch-bound kernels (10 us each): the GPU follows the launches; their excess is the floor.
    short = HostCost(cpu_s=0.2e-3, launch_s=100 * 78e-6, launch_floor_s=100 * 68e-6, serial_launch_s=78e-6)
    assert step_time_s(device_s=1e-3, host=short, async_scheduling=False) == pytest.approx(
        0.2e-3 + 78e-6 + 1e-3 + 100 * 68e-6)
    # A CUDA graph launches before the GPU starts: the whole launch is serial, as before.
    graph = HostCost(cpu_s=0.2e-3, launch_s=20e-6, launch_floor_s=0.0)
    assert step_time_s(device_s=10e-3, host=graph, async_scheduling=False) == pytest.approx(0.2e-3 + 20e-6 + 10e-3)
    assert step_time_s(device_s=10e-3, host=eager, async_scheduling=True) == pytest.approx(10e-3)

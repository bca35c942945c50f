"""The closed-form cost models of simlib.costs, on hand-computed cases and against the simulator."""
from __future__ import annotations

import math

import numpy as np
import pytest

import simlib
from simlib import costs
from simlib.sim import default_problem


def test_pipeline_bubble_is_p_minus_one_over_m_plus_p_minus_one() -> None:
    assert costs.pipeline_bubble(4, 12) == pytest.approx(3 / 15)
    assert costs.pipeline_bubble(1, 5) == 0.0
    assert costs.pipeline_time(4, 12, 2.0) == pytest.approx(30.0)


def test_pipeline_schedule_idle_fraction_equals_the_bubble() -> None:
    for p, m in [(2, 1), (4, 4), (4, 16), (8, 3)]:
        grid = costs.pipeline_schedule(p, m)
        assert grid.shape == (p, m + p - 1)
        assert (grid < 0).mean() == pytest.approx(costs.pipeline_bubble(p, m))
        # every stage sees the micro-batches in order, one slot after the stage before it
        for s in range(p):
            assert grid[s][grid[s] >= 0].tolist() == list(range(m))
            assert int(np.argmax(grid[s] >= 0)) == s


def test_ring_allreduce_closed_form() -> None:
    assert costs.ring_allreduce_time(4, 1e6, 1e-3, 1e9) == pytest.approx(2 * 3 / 4 * 1e6 / 1e9 + 2 * 3 * 1e-3)
    assert costs.ring_allreduce_time(1, 1e6, 1e-3, 1e9) == 0.0


def test_simulated_allreduce_step_matches_the_formula() -> None:
    tr = simlib.run(default_problem(), "bsp", substrate="sim", n_workers=4, steps=3, topology="allreduce", latency=1e-3,
                    bandwidth=1e8).trace
    sends = [s.end - s.start for s in tr.spans if s.kind == "send"]
    expected = costs.ring_allreduce_time(4, 10_000 * 4, 1e-3, 1e8)
    assert sends and all(d == pytest.approx(expected) for d in sends)


def test_tensor_parallel_step_adds_allreduces_per_layer() -> None:
    one = costs.tensor_parallel_step(10, 1e9, 1, 1e6, 1e-5, 1e9, 1e12)
    assert one == pytest.approx(10 * 1e9 / 1e12)  # one device: no communication
    four = costs.tensor_parallel_step(10, 1e9, 4, 1e6, 1e-5, 1e9, 1e12)
    # a transformer layer in training: attention and MLP, one all-reduce forward and one backward each
    assert four == pytest.approx(10 * (1e9 / 4e12 + 4 * costs.ring_allreduce_time(4, 1e6, 1e-5, 1e9)))
    mlp = costs.tensor_parallel_step(10, 1e9, 4, 1e6, 1e-5, 1e9, 1e12, allreduces_per_layer=2)
    assert four - mlp == pytest.approx(10 * 2 * costs.ring_allreduce_time(4, 1e6, 1e-5, 1e9))


def test_data_and_model_parallel_bytes() -> None:
    assert costs.data_parallel_bytes(1000) == 4000
    assert costs.model_parallel_bytes(256, values_per_example=2) == 2048


def test_ps_step_and_mapreduce_iteration() -> None:
    assert costs.ps_step_time(100, 1e-3, 1e6, 0.01) == pytest.approx(3e-3 + 1600 / 1e6 + 0.01)
    assert costs.mapreduce_iteration_time(10.0, 1e9, 1e8, 1.0, 1e6, 1e8, 1e6) == pytest.approx(
        10 + 10 + 1 + 0.01 + 2e-2)


def test_place_waits_for_inputs_and_charges_transfers() -> None:
    g = [costs.Op("a", 1.0, (), 1e6), costs.Op("b", 2.0, ("a",), 1e6), costs.Op("c", 1.0, ("a",)),
         costs.Op("d", 1.0, ("b", "c"))]
    same = costs.place(g, {k: 0 for k in "abcd"}, [1.0], 0.0, 1e6)
    assert same.makespan == pytest.approx(5.0) and same.bytes_moved == 0
    split = costs.place(g, {"a": 0, "b": 0, "c": 1, "d": 0}, [1.0, 1.0], 0.5, 1e6)
    # c starts when a's output arrives on device 1: 1 + 0.5 + 1; d waits for c's (empty) output.
    assert split.start["c"] == pytest.approx(2.5)
    assert split.start["d"] == pytest.approx(max(3.0, 3.5 + 0.5))
    assert split.bytes_moved == 1e6


def test_place_rejects_bad_graphs() -> None:
    with pytest.raises(ValueError, match="device"):
        costs.place([costs.Op("a", 1.0)], {}, [1.0], 0, 1)
    with pytest.raises(ValueError, match="topological"):
        costs.place([costs.Op("b", 1.0, ("a",)), costs.Op("a", 1.0)], {"a": 0, "b": 0}, [1.0], 0, 1)


def test_hyperparameter_search_packs_trials() -> None:
    assert costs.hyperparameter_search([1.0] * 8, 4) == 2.0
    assert costs.hyperparameter_search([3.0, 1.0, 1.0, 1.0], 2) == 3.0
    with pytest.raises(ValueError, match="n_workers"):
        costs.hyperparameter_search([1.0], 0)


def test_crossover_interpolates() -> None:
    assert costs.crossover([0, 1, 2], [0, 1, 2], [1, 1.5, 1.5]) == pytest.approx(1.5)
    assert costs.crossover([0, 1], [0, 1], [2, 3]) is None
    with pytest.raises(ValueError):
        costs.crossover([0, 1], [0], [1, 2])


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="stages"):
        costs.pipeline_bubble(0, 3)
    with pytest.raises(ValueError, match="microbatches"):
        costs.pipeline_schedule(2, 0)
    assert math.isfinite(costs.pipeline_bubble(3, 1))


def test_pipeline_orders_and_their_stash() -> None:
    one = [" ".join(f"{kind}{k}" for kind, k in order) for order in costs.pipeline_orders("1f1b", 3, 4)]
    assert one == ["F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"]
    assert costs.pipeline_orders("gpipe", 2, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 2
    assert costs.stash_peaks(costs.pipeline_orders("gpipe", 3, 4)) == [4, 4, 4]
    assert costs.stash_peaks(costs.pipeline_orders("1f1b", 3, 4)) == [3, 2, 1]
    with pytest.raises(ValueError, match="schedule"):
        costs.pipeline_orders("zero-bubble", 2, 2)
    with pytest.raises(ValueError, match="orders: stage 0 runs a backward before its forward"):
        costs.stash_peaks([[("B", 0), ("F", 0)]])


def test_schedule_timeline_by_hand_and_in_unit_slots() -> None:
    """Two stages, two micro-batches, backward twice a forward, transfers of 0.5 (1F1B): worked out by hand."""
    t = costs.schedule_timeline(costs.pipeline_orders("1f1b", 2, 2), [1, 1], [2, 2], 0.5)
    assert (t.start["F1@1"], t.start["B0@0"], t.start["B1@0"], t.makespan) == (4.5, 5.0, 8.0, 10.0)
    for name in costs.SCHEDULES:
        unit = costs.schedule_timeline(costs.pipeline_orders(name, 4, 8), [1] * 4, [1] * 4, 0.0)
        assert unit.makespan == costs.pipeline_time(4, 8, 2)
    crossed = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]]
    with pytest.raises(ValueError, match="orders: the stages wait on each other for ever"):
        costs.schedule_timeline(crossed, [1, 1], [1, 1], 0.0)

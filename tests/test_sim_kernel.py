"""The simulator's SimPy kernel: plain delays and process wakes in SimPy's own order, interrupts, errors."""
from __future__ import annotations

import traceback

import pytest
import simpy

from simlib.sim.kernel import Environment


def _program(env, log: list, wake: bool, by_step: bool = False) -> None:
    """Three sleepers woken by a waker at t=2 (by their wakes or by events), a delay racing them, a timeout;
    run by ``env.run()``, or one event at a time by ``env.step()`` with ``by_step``."""
    gates: list = []

    def sleeper(name):
        yield 1.0 if isinstance(env, Environment) else env.timeout(1.0)
        gate = env.active_process.wake if wake else env.event()
        gates.append(gate)
        yield gate
        log.append((env.now, name, "woken"))
        yield 0.5 if isinstance(env, Environment) else env.timeout(0.5)
        log.append((env.now, name, "done"))

    def waker():
        yield env.timeout(2.0)
        for g in reversed(gates):
            g.succeed()
        log.append((env.now, "waker", "sent"))

    def racer():
        yield env.timeout(2.0)
        log.append((env.now, "racer", "at 2"))

    for name in ("a", "b", "c"):
        env.process(sleeper(name))
    env.process(waker())
    env.process(racer())
    if not by_step:
        env.run()
    while by_step and env.peek() != float("inf"):
        env.step()


@pytest.mark.parametrize("by_step", [False, True])
@pytest.mark.parametrize("wake", [False, True])
def test_delays_and_wakes_run_in_simpys_order(wake, by_step):
    ours, simpys = [], []
    _program(Environment(), ours, wake, by_step)
    _program(simpy.Environment(), simpys, wake=False)
    assert ours == simpys
    assert ours[:2] == [(2.0, "waker", "sent"), (2.0, "racer", "at 2")]
    assert [n for _, n, what in ours if what == "woken"] == ["c", "b", "a"]  # woken in the order succeeded


def test_an_interrupted_sleeper_is_not_woken_by_its_old_wake():
    env, log, held = Environment(), [], []

    def sleeper():
        old = env.active_process.wake
        held.append(old)
        try:
            yield old
        except simpy.Interrupt as e:
            log.append((env.now, "interrupted", e.cause))
        fresh = env.active_process.wake
        log.append(("fresh wake", fresh is not old))
        yield 3.0
        log.append((env.now, "slept"))

    proc = env.process(sleeper())

    def other():
        yield 1.0
        proc.interrupt("failure")
        yield 1.0
        held[0].succeed()  # the wake the interrupt took away: nothing happens
        log.append((env.now, "old wake sent"))

    env.process(other())
    env.run()
    assert log == [(1.0, "interrupted", "failure"), ("fresh wake", True), (2.0, "old wake sent"), (4.0, "slept")]


def test_an_error_in_a_process_propagates_from_its_own_frame():
    env = Environment()

    def broken():
        yield 1.0
        raise KeyError("boom")

    env.process(broken())
    with pytest.raises(KeyError, match="boom") as info:
        env.run()
    frames = [f.name for f in traceback.extract_tb(info.value.__cause__.__traceback__)]
    assert frames == ["broken"]  # the kernel's resume is not in the generator's traceback


def test_a_process_that_returns_gives_its_value():
    env = Environment()

    def child():
        yield 0.25
        return 42

    def parent(out):
        out.append((yield env.process(child())))
        out.append(env.now)

    out: list = []
    env.process(parent(out))
    env.run()
    assert out == [42, 0.25]

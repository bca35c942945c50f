"""Cost-only runs of the plain parameter server, compiled: the engine's events, in its order, in one loop.

A cost-only run with a fixed step (``SimConfig.cost_only``, ``step_keys``) on one server shard, one site,
BSP / SSP / async (backup workers and stragglers' jitter, slow workers and pauses included; no deadline,
no failure, no plugged-in read rule) is a small state machine per worker: wait at the gate, request
(in-link), reply (out-link), compute, push (in-link), deliver. :func:`run` replays exactly the events
:class:`simlib.sim.engine._Run` schedules for it, ordered as SimPy orders them (time, then the order they
were scheduled in), with the same float arithmetic, so the trace is the engine's bit for bit
(``tests/test_sim_fastcost.py`` compares the two on every protocol and option it covers).

NOTE: this replaces, for that case only, the generic engine's Python per event (100,000 workers x 10 BSP
steps: 15.3 CPU s there, 1.3 s here); everything else runs on the engine. It is a second path, so the
test above pins it to the first.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from simlib.signals import hold_while_compiling
from simlib.trace import _NUMPY, SpanLog, UpdateLog

hold_while_compiling()  # the kernel below compiles on a run's first call

# Event kinds: a gate opened (a woken waiter), the request reached the server, the reply reached the
# worker, the computation ended, the push reached the server.
_GATE, _REQUEST, _REPLY, _COMPUTED, _PUSHED = 0, 1, 2, 3, 4
_COMPUTE, _SEND, _RECV, _WAIT = 0, 1, 2, 3  # simlib.trace.SPAN_KINDS' order


def eligible(run: Any) -> bool:
    """Whether :func:`run` covers this run's configuration (else the engine runs it)."""
    cfg = run.cfg
    return (cfg.cost_only and cfg.step_keys is not None and cfg.topology == "ps" and run.n_shards == 1
            and cfg.sites == 1 and cfg.hierarchy == "flat" and not cfg.cached and cfg.timeout is None
            and cfg.stragglers.fail_worker is None and cfg.read_rule is None and run.compressors is None
            and cfg.clock_batches == 1 and cfg.managed_bandwidth is None)


@njit(cache=True)
def _push(heap, n, t, s, w, k):  # pragma: no cover - compiled
    """Add (t, s) -> (w, k) to the binary heap (ht, hs, hw, hk) of n entries ordered by (time, sequence); returns
    n + 1."""
    ht, hs, hw, hk = heap
    j = n
    while j > 0:
        p = (j - 1) >> 1
        if ht[p] < t or (ht[p] == t and hs[p] < s):
            break
        ht[j], hs[j], hw[j], hk[j] = ht[p], hs[p], hw[p], hk[p]
        j = p
    ht[j], hs[j], hw[j], hk[j] = t, s, w, k
    return n + 1


@njit(cache=True)
def _pop(heap, n):  # pragma: no cover - compiled
    """Remove the first entry of the heap of n entries (the caller has read it); returns n - 1."""
    ht, hs, hw, hk = heap
    n -= 1
    t, s, w, k = ht[n], hs[n], hw[n], hk[n]
    j = 0
    while True:
        a = 2 * j + 1
        if a >= n:
            break
        b = a + 1
        if b < n and (ht[b] < ht[a] or (ht[b] == ht[a] and hs[b] < hs[a])):
            a = b
        if t < ht[a] or (t == ht[a] and s < hs[a]):
            break
        ht[j], hs[j], hw[j], hk[j] = ht[a], hs[a], hw[a], hk[a]
        j = a
    ht[j], hs[j], hw[j], hk[j] = t, s, w, k
    return n


@njit(cache=True, inline="always")
def _send(heap, n, seq, i, now, free, cost, kind):  # pragma: no cover - compiled
    """Worker i's message (event ``kind`` on arrival) queues at ``now`` on a link free at ``free``; cost = (hold,
    latency): it holds the link ``hold``, then travels ``latency`` (as transmit does); returns (n, seq, free) after."""
    hold, latency = cost
    fin = max(now, free) + hold
    n = _push(heap, n, now + ((fin - now) + latency), seq, i, kind)
    return n, seq + 1, fin


@njit(cache=True, inline="always")
def _span(spans, n, i, kind, start, end, nbytes, c):  # pragma: no cover - compiled
    """Append worker i's span (start, end) of step c to the n spans in the columns if it lasted; returns their count."""
    if end <= start:
        return n
    sw, sk, ss, se, sn, sc = spans
    sw[n], sk[n], ss[n], se[n], sn[n], sc[n] = i, kind, start, end, nbytes, c
    return n + 1


@njit(cache=True)
def _simulate(shape, link, compute, spans, updates, barriers, finished):  # pragma: no cover - compiled
    """The run; fills the span and update columns; returns (spans, updates, barriers, applied, skipped steps).

    shape = (n_workers, steps, needs, rounds, quorum); link = (request, response and push bytes, latency,
    bandwidth, server time); compute = (base, n_slow, slow_factor, jitter, pauses, pause_prob, pause_time);
    spans and updates: the trace's columns (see :func:`run`).
    """
    n_workers, steps, needs, rounds, quorum = shape
    req_bytes, resp_bytes, push_bytes, latency, bandwidth, server_time = link
    base, n_slow, slow_factor, jitter, pauses, pause_prob, pause_time = compute
    req_hold = server_time + req_bytes / bandwidth  # how long each message holds its link
    resp_hold, push_hold = resp_bytes / bandwidth, server_time + push_bytes / bandwidth
    ut, uw, uc, us, ua, ul = updates
    ht = np.empty(n_workers, np.float64)
    hs = np.empty(n_workers, np.int64)
    hw = np.empty(n_workers, np.int64)
    hk = np.empty(n_workers, np.int64)
    heap = (ht, hs, hw, hk)
    n = seq = 0  # entries on the heap, events scheduled
    clock = np.zeros(n_workers, np.int64)
    t0 = np.zeros(n_workers, np.float64)
    t_pull = np.zeros(n_workers, np.float64)
    t_comp = np.zeros(n_workers, np.float64)
    version = np.zeros(n_workers, np.int64)
    lag = np.zeros(n_workers, np.int64)
    draws = np.zeros(n_workers, np.int64)
    accepted = np.zeros(steps + 1, np.int64)
    done = np.zeros(steps + 1, np.bool_)
    head = np.full(steps + 1, -1, np.int64)  # waiters per needed step: a linked list in arrival order
    tail = np.full(steps + 1, -1, np.int64)
    nxt = np.full(n_workers, -1, np.int64)
    completed = acc_version = 0
    n_spans = n_updates = n_barriers = applied_total = skipped = 0
    in_free = out_free = now = 0.0
    # Every worker starts at time 0, in order (SimPy's process starts are urgent): each opens step 0.
    for i in range(n_workers):
        # the gate at step 0 is open (needs[0] = 0): open the pull (lag and t_pull start at 0)
        n, seq, in_free = _send(heap, n, seq, i, now, in_free, (req_hold, latency), _REQUEST)
    while n > 0:
        now, i, kind = ht[0], hw[0], hk[0]
        n = _pop(heap, n)
        c = clock[i]
        if kind == _REQUEST:  # the server reads: the version the push's tau counts from; the reply leaves
            version[i] = completed if rounds else acc_version
            n, seq, out_free = _send(heap, n, seq, i, now, out_free, (resp_hold, latency), _REPLY)
            continue
        if kind == _REPLY:  # the values arrived: compute
            t_comp[i] = now
            n_spans = _span(spans, n_spans, i, _RECV, t_pull[i], now, req_bytes + resp_bytes, c)
            t = base * (slow_factor if i < n_slow else 1.0)
            d = draws[i]
            if jitter.shape[1] > 0:
                t *= jitter[i, d]
            if pauses.shape[1] > 0 and pauses[i, d] < pause_prob:
                t += pause_time
            draws[i] = d + 1
            n = _push(heap, n, now + t, seq, i, _COMPUTED)
            seq += 1
            continue
        if kind == _COMPUTED:  # push
            n_spans = _span(spans, n_spans, i, _COMPUTE, t_comp[i], now, 0, c)
            t0[i] = now  # the push's start
            n, seq, in_free = _send(heap, n, seq, i, now, in_free, (push_hold, latency), _PUSHED)
            continue
        if kind == _PUSHED:  # delivered: applied or dropped, waiters woken, the next step opened
            n_spans = _span(spans, n_spans, i, _SEND, t0[i], now, push_bytes, c)
            tau = (completed if rounds else acc_version) - version[i]
            before = completed
            applied = not (c < completed or done[c])
            if applied:
                accepted[c] += 1
                if accepted[c] >= quorum:
                    done[c] = True
                    accepted[c] = 0
                    while completed <= steps and done[completed]:
                        done[completed] = False
                        completed += 1
            for step_done in range(before + 1, completed + 1):
                barriers[n_barriers] = now
                n_barriers += 1
                if step_done <= steps:
                    w = head[step_done]
                    while w >= 0:
                        n = _push(heap, n, now, seq, w, _GATE)
                        seq += 1
                        w = nxt[w]
                    head[step_done] = -1
                    tail[step_done] = -1
            if applied:
                acc_version += 1
            ut[n_updates], uw[n_updates], uc[n_updates], us[n_updates], ua[n_updates], ul[n_updates] = \
                now, i, c, tau, applied, lag[i]
            n_updates += 1
            if applied:
                applied_total += 1
                c += 1
            else:
                step_next = max(c + 1, completed)
                skipped += step_next - (c + 1)
                c = min(step_next, steps)
            clock[i] = c
            if c >= steps:
                finished[i] = True
                continue
            t0[i] = now
            need = needs[c]
            if completed < need:  # the gate is shut (protocol.may_read): wait for that many complete steps
                if head[need] < 0:
                    head[need] = i
                else:
                    nxt[tail[need]] = i
                tail[need] = i
                nxt[i] = -1
                continue
        elif kind == _GATE:  # woken at the gate
            n_spans = _span(spans, n_spans, i, _WAIT, t0[i], now, 0, c)
        # The gate is open: open the pull.
        lag[i] = max(c - completed, 0)
        t_pull[i] = now
        n, seq, in_free = _send(heap, n, seq, i, now, in_free, (req_hold, latency), _REQUEST)
    return n_spans, n_updates, n_barriers, applied_total, skipped, now


def run(state: Any) -> float:
    """Run ``state`` (an engine ``_Run`` that :func:`eligible` accepts) here; fills its trace; returns the end time."""
    cfg = state.cfg
    st = cfg.stragglers
    n, steps = cfg.n_workers, cfg.steps
    keys = len(state.fixed_keys)
    # The read rule stays protocol.py's: per clock, the complete steps a read waits for (Clocks.needed; async none).
    rule = state.clocks.rule
    needs = np.zeros(steps + 1, np.int64)
    if not math.isinf(rule.bound):
        needs[:] = [max(rule.needed(c), 0) for c in range(steps + 1)]
    jitter, pauses = state.compute.predrawn(steps)
    # The trace's columns, of their types (SpanLog: worker, kind, start, end, nbytes, step; UpdateLog: time, worker,
    # step, staleness, applied, clock lag); at most four spans a step.
    cols = [np.empty(4 * n * steps, _NUMPY[code]) for code in SpanLog._codes]
    ucols = [np.empty(n * steps, _NUMPY[code]) for code in UpdateLog._codes]
    barriers = np.empty(steps + 1, np.float64)
    finished = np.zeros(n, np.bool_)
    link = (float(keys * cfg.key_bytes), float(keys * cfg.value_bytes), float(keys * cfg.entry_bytes),
            float(cfg.latency), float(cfg.bandwidth), float(cfg.server_time))
    compute = (float(state.compute.base(state.fixed_units)), int(st.slow_workers), float(st.slow_factor), jitter,
               pauses, float(st.pause_prob), float(st.pause_time))
    n_spans, n_updates, n_barriers, applied, skipped, end = _simulate(
        (n, steps, needs, cfg.proto.rounds, n - cfg.backup_workers), link, compute, tuple(cols), tuple(ucols), barriers,
        finished)
    # NOTE: copied one column at a time, each freed once copied (100,000 x 100 BSP: peak 3.1 GB -> 2.2 GB).
    state.trace.spans = SpanLog.from_columns([c[:n_spans] for c in _drain(cols)])
    state.trace.updates = UpdateLog.from_columns([c[:n_updates] for c in _drain(ucols)])
    state.clocks.barriers.extend(barriers[:n_barriers].tolist())
    state.finished = finished.tolist()
    state.applied = applied
    state.done_steps = n_updates + skipped
    return end


def _drain(items: list) -> list:
    """The list's items, the list emptied (so the caller's list no longer keeps them alive)."""
    out = items[:]
    items.clear()
    return out

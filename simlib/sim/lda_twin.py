"""AD-LDA on the simulated cluster: the real Gibbs sweeps, a parameter server's clock and network.

Each simulated worker owns a block of documents (the same split as ``simlib.parallel.lda``) and
runs the real compiled sweep of :mod:`simlib.problems.lda_gibbs` against the table it last
pulled, so a stale table gives really stale samples. One clock of worker i:

1. *gate*: under the config's protocol a worker at clock c waits until steps < c - s are
   complete (``simlib.sim.clocks.ClockTable``: BSP s = 0, SSP s, async never waits);
2. *pull*: a request (key_bytes per word the worker holds) enters the server's in-link, the
   server copies those rows of n_wk (and n_k) on arrival, and the reply (K value_bytes per
   row) leaves through its out-link; each costs latency + bytes / bandwidth, queued FIFO;
3. *compute*: the sweep over its tokens, charged compute_overhead + tokens * compute_per_unit
   seconds, times the config's straggler noise (``simlib.sim.stragglers.ComputeModel``);
4. *push*: the non-zero count deltas, (key_bytes + value_bytes) each, travel to the server,
   which adds them on arrival.

Every time n_workers pushes have landed, the trace records the joint log p(w, z) of the
server's table with every worker's last pushed doc-topic counts (against simulated seconds).
Same config and seed, same trace, bit for bit.

Example::

    >>> from simlib.problems.lda import make_synthetic_corpus
    >>> from simlib.sim import SimConfig
    >>> corpus, _, _ = make_synthetic_corpus(seed=0)
    >>> cfg = SimConfig(n_workers=4, protocol="ssp", staleness=2, steps=10, compute_per_unit=1e-7)
    >>> trace = simulate_lda(corpus, n_topics=8, alpha=0.5, cfg=cfg)
    >>> trace.summary()["max_clock_lag"] <= 2  # the SSP bound on every read
    True
"""
from __future__ import annotations

import numpy as np
import simpy

from simlib.problems.lda import (
    LDACorpus, check_hyper, count_tables, doc_log_likelihood, random_assignments, shard_documents, word_log_likelihood,
)
from simlib.problems.lda_gibbs import GibbsState
from simlib.sim.clocks import ClockTable
from simlib.sim.config import SimConfig
from simlib.sim.network import Node, transmit
from simlib.sim.stragglers import ComputeModel
from simlib.trace import Trace


def _check_config(cfg: SimConfig, corpus: LDACorpus) -> None:
    """Reject the config features that would drop or reorder count deltas (counts must stay exact)."""
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    if cfg.topology != "ps" or cfg.n_servers != 1 or cfg.n_summation:
        raise ValueError("topology must be 'ps' with n_servers=1 and n_summation=0 for the LDA twin")
    if cfg.backup_workers or cfg.timeout is not None:
        raise ValueError("backup_workers and timeout drop count deltas; the LDA twin needs every push (set 0 / None)")
    if cfg.compression not in (None, "none"):
        raise ValueError("compression must be None for the LDA twin: count deltas are exact integers")
    if cfg.stragglers.fail_worker is not None:
        raise ValueError("stragglers.fail_worker is not supported by the LDA twin")
    if cfg.n_workers > corpus.n_docs:
        raise ValueError(f"n_workers must be <= the number of documents ({corpus.n_docs}), got {cfg.n_workers}")


def simulate_lda(
    corpus: LDACorpus, n_topics: int, alpha: float = 0.1, beta: float = 0.01, cfg: SimConfig | None = None,
) -> Trace:
    """Run ``cfg.steps`` AD-LDA clocks per worker on the simulated cluster; return the trace (substrate 'sim').

    Uses from ``cfg``: n_workers, protocol, staleness, steps (sweeps), latency, bandwidth,
    compute_per_unit (seconds per token), compute_overhead, stragglers, key_bytes, value_bytes,
    seed. ``trace.meta['table_clock']`` lists, per worker, the clock of each table it sampled against.
    """
    cfg = SimConfig() if cfg is None else cfg
    check_hyper(n_topics, alpha, beta)
    _check_config(cfg, corpus)
    K, n = n_topics, cfg.n_workers
    env = simpy.Environment()
    clocks = ClockTable(env, n, cfg.proto)
    compute = ComputeModel(cfg, np.random.SeedSequence(cfg.seed))
    server = Node("server")
    z0 = random_assignments(corpus, K, cfg.seed)
    _, n_wk, n_k = count_tables(corpus, z0, K)
    bounds = shard_documents(corpus, n)
    states, rows = [], []
    for i in range(n):
        shard = corpus.subset(np.arange(bounds[i], bounds[i + 1]))
        t0, t1 = corpus.offsets[bounds[i]], corpus.offsets[bounds[i + 1]]
        states.append(GibbsState(shard, K, alpha, beta, z0[t0:t1], n_wk=n_wk.copy(), n_k=n_k.copy()))
        rows.append(np.unique(shard.words))
    doc_ll = [doc_log_likelihood(s.n_dk, alpha) for s in states]
    trace = Trace(label=cfg.label, substrate="sim", n_workers=n, metric="log_likelihood", lower_is_better=False)
    trace.record_quality(0.0, 0, word_log_likelihood(n_wk, n_k, beta) + sum(doc_ll))
    table_clock: list[list[int]] = [[] for _ in range(n)]
    landed = [0]

    def worker(i: int):
        st, mine = states[i], rows[i]
        for c in range(cfg.steps):
            t0 = env.now
            gate = clocks.gate(c)
            if gate is not None:
                yield gate
                trace.span(i, "wait", t0, env.now, step=c)
            clocks.open(c)
            lag = clocks.rule.clock_lag(c)
            t_pull = env.now
            req, resp = len(mine) * cfg.key_bytes, (len(mine) + 1) * K * cfg.value_bytes
            yield from transmit(env, server.inlink, req, cfg.latency, cfg.bandwidth)
            st.n_wk[mine] = n_wk[mine]  # the server reads its table when the request arrives
            st.n_k[:] = n_k
            table_clock[i].append(clocks.completed)
            read_version = landed[0]
            yield from transmit(env, server.outlink, resp, cfg.latency, cfg.bandwidth)
            trace.span(i, "recv", t_pull, env.now, nbytes=req + resp, step=c)
            t_comp = env.now
            pulled_wk, pulled_k = st.n_wk[mine].copy(), st.n_k.copy()
            st.sweep(seed=cfg.seed * 1_000_003 + i * 10_007 + c)
            yield env.timeout(compute.time(i, st.corpus.n_tokens))
            trace.span(i, "compute", t_comp, env.now, step=c)
            d_wk, d_k = st.n_wk[mine] - pulled_wk, st.n_k - pulled_k
            nbytes = int(np.count_nonzero(d_wk)) * (cfg.key_bytes + cfg.value_bytes) + K * cfg.value_bytes
            t_push = env.now
            yield from transmit(env, server.inlink, nbytes, cfg.latency, cfg.bandwidth)
            n_wk[mine] += d_wk  # applied when the last byte arrives
            n_k[:] += d_k
            doc_ll[i] = doc_log_likelihood(st.n_dk, alpha)
            trace.span(i, "send", t_push, env.now, nbytes=nbytes, step=c)
            clocks.deliver(c)
            trace.update(env.now, i, c, landed[0] - read_version, True, clock_lag=lag)
            landed[0] += 1
            if landed[0] % n == 0:
                trace.record_quality(env.now, landed[0] // n, word_log_likelihood(n_wk, n_k, beta) + sum(doc_ll))

    for i in range(n):
        env.process(worker(i))
    env.run()
    z = np.concatenate([s.z for s in states])
    _, check_wk, check_k = count_tables(corpus, z, K)
    if not (np.array_equal(check_wk, n_wk) and np.array_equal(check_k, n_k)):  # pragma: no cover - an invariant
        raise RuntimeError("the simulated server's table differs from the counts of the final assignments")
    trace.meta.update(config=cfg.to_dict(), protocol_label=cfg.label, n_topics=K, n_tokens=corpus.n_tokens,
                      table_clock=table_clock, stragglers=cfg.stragglers.describe())
    return trace


__all__ = ["simulate_lda"]

"""AD-LDA on the parameter-server contract: the word-topic counts are the table.

The table is n_wk flattened (key w * K + k) followed by the topic totals n_k (key V * K + k), as
float64. A worker's shard is its worker-local state (:class:`LDAShard`): its documents, their
assignments z and doc-topic counts n_dk (a :class:`~simlib.problems.lda_gibbs.GibbsState`); each
worker process holds its own copy. One clock is one sweep of the worker's documents:

* ``keys``: the K counts of every word the shard contains, then the K totals;
* ``step``: load the counts read into the state, run one collapsed Gibbs sweep (the compiled
  sweep of :mod:`~simlib.problems.lda_gibbs`), and push the count deltas that moved (``lr`` is
  ignored: a sample is not a gradient);
* ``quality``: the word part of the likelihood, log p(w | z), the one part a table holds (the
  doc part, log p(z), needs every worker's n_dk);
* ``local_steps``: the same sweeps in place on shm's int32 table. One worker samples on the
  table itself (the serial sampler, token for token); several sample on its rows too, each block
  of words under a lock shared by the workers, and sync their topic totals n_k every
  ``sync_every`` tokens, so the table stays exact and a worker sees the others' moves at once.

The sweep's seed is derived from (seed, worker, clock), so a simulated run is deterministic.
Each push moves tokens between topics, so the table always holds exactly the corpus's tokens:
``n_wk`` sums to N and ``n_k`` equals its column sums (:meth:`LDAProblem.check_counts`) -- as long
as every push is applied whole; backup workers, deadlines, lossy compression and step rules (accumulation
averages pushes) drop or bend pushes, so :attr:`LDAProblem.exact_deltas` tells ``simlib.run`` to refuse them.

Example::

    >>> import simlib
    >>> from simlib.problems.lda import make_synthetic_corpus
    >>> corpus, _, _ = make_synthetic_corpus(n_docs=60, n_topics=4, n_words=50, doc_length=30, seed=0)
    >>> prob = LDAProblem(corpus, n_topics=4, alpha=0.5)
    >>> res = simlib.run(prob, "ssp:1", substrate="sim", n_workers=3, steps=5)
    >>> prob.check_counts(res.params)
    >>> res.quality > res.trace.quality[0].value
    True
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.backend import to_numpy
from simlib.problems.atomic import atomic_add, compare_swap
from simlib.problems.lda import (LDACorpus, _count_pairs, check_corpus, deal_documents, doc_topic_counts,
                                log_likelihood, random_assignments, word_counts, word_log_likelihood)
from simlib.problems.lda_gibbs import KERNELS, MH_STEPS, GibbsState, _list_dtype, _rng_state, blocks, check_prior

#: In place with several workers: each worker's tokens per block, between two syncs of n_k (see LDAProblem.local_steps).
# NOTE: the rows are the table's own, so a block's size bounds only how stale n_k gets. KJV, K = 1,000, 2 workers,
# BSP, 30 sweeps, sparse, log p per token against one process's -9.0935: blocks of 256 tokens -9.0876, -9.0895;
# 1,024: -9.0822 to -9.1061; 4,096: -9.0953, -9.0849, with 2 workers' CPU 2.33-2.38 s, 2.36-2.42 s and 2.19-2.24 s
# (the calls, the n_k reads and the 1 / (n_k + V b) each block takes cost K each).
SYNC_EVERY = 4096
# Bytes per topic: the float64 table (V + 1 rows) and the count tables n_dk, n_wk, counted as
# int64 then kept as int32 (D + V rows) (and the word kernel's lists of topics, V rows); and each worker's int32 copy of
# n_wk and n_k.
_TABLE_BYTES_PER_ROW, _COUNT_BYTES_PER_ROW, _COPY_BYTES_PER_ROW = 8, 12, 4


@dataclass
class LDAShard:
    """A worker's local state: its Gibbs state, its words' table keys, and the clock it is at."""

    state: GibbsState
    worker: int
    words: np.ndarray  # the distinct words of the shard, sorted
    keys: np.ndarray | None  # w * K + k for those words, then V * K + k (built by LDAProblem.keys on first use)
    seed: int
    clock: int = 0
    local: np.ndarray | None = None  # each token's word as an index into ``words`` (computed once)
    own_wk: np.ndarray | None = None  # the shard's own counts of its words (len(words), K), kept up to date
    own_k: np.ndarray | None = None  # and its own topic totals (K,)
    device: Any = None  # on the gpu substrate: its tokens, z and n_dk on the device (lda_device.DeviceShard)
    n_workers: int = 1  # how many shards share the table (alone, a worker samples on the table itself)
    blocks: np.ndarray | None = None  # in place: word boundaries of the blocks, the same for every worker
    table: Any = None  # in place: the table its state's n_wk (and, alone, n_k) are views of

    def sweep_seed(self) -> int:
        """seed * 1_000_003 + worker * 10_007 + clock: one stream per worker and clock."""
        return self.seed * 1_000_003 + self.worker * 10_007 + self.clock


class LDAProblem:
    """Collapsed Gibbs LDA as a Problem: table = (n_wk, n_k), shard = a worker's documents and topics."""

    metric = "log_likelihood"
    lower_is_better = False
    linear_step = False  # count moves do not scale with a step size
    table_dtype = np.int32  # where a substrate keeps the table in place (shm): counts, exact in 32 bits
    exact_deltas = True  # every push must be applied whole, or the counts no longer match the topics
    in_place_chunk = 1  # on shm in place, a worker publishes its clock after every sweep (a step is a whole sweep)
    # the gpu substrate's sweeps: 'hogwild' (a block per document, batch_size of its tokens in flight, up to 32; see
    # simlib.problems.lda_device), which 'auto' picks on NumPy and CuPy up to 4,000 topics, or batches of batch_size
    # tokens drawn at once: 'fused' (CuPy's kernels; 'auto' past 4,000 topics) or 'array' (NumPy or CuPy)
    device_kernel = "auto"

    def __init__(self, corpus: LDACorpus, n_topics: int, alpha: float = 0.1, beta: float = 0.01,
                 seed: int = 0, kernel: str = "sparse", sync_every: int | None = None, mh_steps: int = MH_STEPS):
        check_corpus(corpus)
        check_prior(kernel, n_topics, alpha, beta, mh_steps)
        # by default max(SYNC_EVERY, 2^20 / K) tokens: a block's calls stay ~1% of its sampling where K is small
        sync_every = max(SYNC_EVERY, 2**20 // n_topics) if sync_every is None else sync_every
        check.positive_int("sync_every", sync_every)
        self.corpus, self.K, self.alpha, self.beta = corpus, int(n_topics), float(alpha), float(beta)
        self.seed, self.kernel, self.sync_every, self.mh_steps = int(seed), kernel, int(sync_every), int(mh_steps)
        self.V = corpus.n_words
        per_topic = _TABLE_BYTES_PER_ROW * (self.V + 1) + _COUNT_BYTES_PER_ROW * (corpus.n_docs + self.V)
        per_topic += _list_dtype(self.K).itemsize * self.V if kernel == "word" else 0  # the word kernel's lists
        check.fits_memory("n_topics", self.K, self.K * per_topic, per_topic,
                          f"the word-topic table and counts of {self.V} words and {corpus.n_docs} documents")
        self.n_params = self.V * self.K + self.K
        self.z0 = random_assignments(corpus, self.K, self.seed)

    def validate(self) -> None:
        """Check the corpus again (it may have changed since): the Gibbs kernels index it unchecked."""
        check_corpus(self.corpus)

    def check_run(self, protocol: Any, substrate: str) -> None:
        """Refuse a CPU sampler the substrate would not run: the gpu substrate samples with its own device kernels."""
        if substrate == "gpu" and self.kernel != "sparse":
            raise ValueError(f"kernel={self.kernel!r}: the gpu substrate does not run the CPU samplers "
                             f"({', '.join(KERNELS)}); it samples with its device kernels, device_kernel 'auto', "
                             "'hogwild', 'fused' or 'array' (an attribute of the problem), and takes only the "
                             f"default kernel='sparse'; run kernel={self.kernel!r} on pipes, shm, ray or sim")

    def miniature(self) -> "LDAProblem":
        """The same problem on its first two documents, their words renumbered (same topics): what a warm-up
        compiles on."""
        # NOTE: the kernels compile per argument type, not shape; the two documents' own vocabulary keeps the
        # warm-up's tables small (at K = 10,000 on the KJV the full vocabulary's float64 table was 418 MB).
        two = self.corpus.subset(range(min(2, self.corpus.n_docs)))
        used, ids = np.unique(two.words, return_inverse=True)
        mini = LDACorpus(ids, two.offsets, len(used))
        return LDAProblem(mini, self.K, self.alpha, self.beta, self.seed, self.kernel, self.sync_every, self.mh_steps)

    def init_params(self) -> np.ndarray:
        """The counts of the random start z0: n_wk flattened, then n_k (float64)."""
        return self.init_table(np.float64)

    def init_table(self, dtype: Any = np.int32) -> np.ndarray:
        """init_params in ``dtype`` (int32: the shm table), built without a float64 copy."""
        out = np.zeros(self.n_params, dtype)
        _count_pairs(self.corpus.words, self.z0, out[:-self.K].reshape(self.V, self.K))
        out[-self.K:] = np.bincount(self.z0, minlength=self.K)
        return out

    def shards(self, n_workers: int) -> list[LDAShard]:
        """One worker-local state per worker: about N / n_workers tokens, in runs of documents from all over the
        corpus (:func:`~simlib.problems.lda.deal_documents`)."""
        check.positive_int("n_workers", n_workers, self.corpus.n_docs)  # one document each at least
        lists = _list_dtype(self.K).itemsize if self.kernel == "word" else 0  # and the word kernel's lists of topics
        per_worker = (_COPY_BYTES_PER_ROW + lists) * (self.V + 1) * self.K
        check.fits_memory("n_workers", n_workers, n_workers * per_worker, per_worker,
                          f"each worker's copy of the counts of {self.V} words x {self.K} topics")
        word_blocks = self._word_blocks(n_workers)
        n_k = np.bincount(self.z0, minlength=self.K).astype(np.int32)
        out = []
        dealt = deal_documents(self.corpus, n_workers)
        for i, (own, tokens) in enumerate(zip(dealt, self._tokens(dealt))):
            docs = self.corpus.subset(own)
            # NOTE: the worker's copy of n_wk starts as zeros: a get / step / add read loads the rows of the shard's
            # words before a sweep uses them, and in place (shm) a worker samples on the table itself. Untouched,
            # the zeros take no memory (at K = 10,000 on the KJV a full copy per worker was 209 MB).
            state = GibbsState(docs, self.K, self.alpha, self.beta, self.z0[tokens],
                               counts=(np.zeros((self.V, self.K), np.int32), n_k.copy()), kernel=self.kernel,
                               mh_steps=self.mh_steps)
            # NOTE: the tokens' word indices are computed once per shard; a searchsorted over every token per
            # step cost more than the Gibbs sweep itself (84 ms against 66 ms for 10 steps of 150 k tokens).
            words, local = (a.astype(np.int64) for a in np.unique(docs.words, return_inverse=True))
            out.append(LDAShard(state, i, words, None, self.seed, local=local, n_workers=n_workers,
                                blocks=word_blocks))
        return out

    def batch(self, shard: LDAShard, step: int, batch_size: int) -> LDAShard:
        """The whole shard (one clock = one sweep; ``batch_size`` is unused), stamped with its clock."""
        shard.clock = step
        return shard

    def keys(self, batch: LDAShard) -> np.ndarray:
        """The K counts of each word the shard holds, then the K totals (sorted)."""
        if batch.keys is None:  # built on first use: in place on shm no keys are read (at K = 10,000: 418 MB)
            K, V = batch.state.n_topics, batch.state.corpus.n_words  # the shard's own (a miniature's, in a warm-up)
            topics = np.arange(K)
            batch.keys = np.concatenate([(batch.words[:, None] * K + topics).ravel(), V * K + topics])
        return batch.keys

    def work(self, batch: LDAShard) -> int:
        """Tokens swept."""
        return batch.state.corpus.n_tokens

    def step(self, values: np.ndarray, batch: LDAShard, keys: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """(keys, deltas): one Gibbs sweep against the counts read; the deltas are the tokens it moved."""
        st, K = batch.state, self.K
        if batch.own_wk is None:  # the shard's own counts: n_wk rows of its words, and n_k, from its assignments
            batch.own_wk, batch.own_k = word_counts(batch.local, st.z, len(batch.words), K)
        # NOTE: a read holds the worker's own tokens whenever its last push was applied before its
        # next pull (every substrate, without accumulation); the maximum binds only for a read that
        # does not (pushes held back by accumulation, or an empty warm-up read), where the sweep
        # would otherwise take tokens out of empty cells. The deltas are the moves either way.
        # The two kernels replace ~10 NumPy passes over the read (cast, maximum, scatter into the
        # state, two gathers, a subtraction, a nonzero, the own counts' bincount): at K = 100 on the
        # KJV they cost more than the sweep itself.
        before = np.empty(len(keys), np.int32)
        _load_counts(values, batch.own_wk, batch.own_k, batch.words, st.n_wk, st.n_k, before)
        st.counts_changed()
        st.sweep(seed=batch.sweep_seed())
        return _moved_counts((st.n_wk, st.n_k), batch.words, before, keys, (batch.own_wk, batch.own_k))

    def local_steps(self, table: np.ndarray, shard: LDAShard, first: int, count: int, batch_size: int,
                    lr: float, shared: np.ndarray | None = None) -> None:
        """Sweeps first .. first+count-1 against the shared table (shm in place); ``batch_size``, ``lr`` unused.

        Alone (one worker), the sweep samples on the table itself. Otherwise the vocabulary is cut into
        the same blocks of words for every worker (about ``sync_every`` of each worker's tokens each),
        and a worker samples a block's words on the table's own rows while it holds the block's lock
        (``shared``: int32 words shared by the workers, :meth:`in_place_words` of them: a lock per block,
        then for the word kernel its lists of each word's topics, which the block's holder keeps): no copy
        of a row, no push of a row, and no other worker writes those rows meanwhile, so the counts stay
        exact. n_k is the worker's own copy, read from the table when it takes a block and its net change
        added back, atomically, before it lets the block go. A block held by another
        worker is put off until the worker has swept the others. Staleness is then the other workers'
        moves within a block, in n_k only.
        """
        if not isinstance(table, np.ndarray) or table.dtype != np.int32 or table.shape != (self.n_params,):
            raise ValueError(f"table must be the int32 table of {self.n_params} counts, got "
                             f"{getattr(table, 'dtype', type(table).__name__)} of shape "
                             f"{getattr(table, 'shape', None)}")
        st, K, V = shard.state, self.K, self.V
        tab_wk, tab_k = self.split(table)
        alone = shard.n_workers == 1
        if not alone:
            shared = np.zeros(self.in_place_words(shard.n_workers), np.int32) if shared is None else shared
            nb = len(shard.blocks) - 1
            locks = shared[:nb]
        if shard.table is not table:
            # NOTE: one worker is the table's only writer: sampling on it in place is the bare serial sweep (no
            # read, no push; at K = 1,000 on the KJV, reading and diffing 5.2 M counts per sweep cost ~40% of it).
            # Several sample on its rows too, each under its block's lock (reading a worker's rows into a copy
            # and pushing its moves by atomic adds cost 2 workers 17% more CPU than 1 at K = 1,000).
            st.n_wk, shard.table = tab_wk, table
            st.n_k = tab_k if alone else st.n_k
            # the word kernel's lists of each word's topics, kept by whoever holds the word's block
            lists = None if alone or self.kernel != "word" else self._word_lists(shared[nb:])
            st.counts_changed(lists)
        if not alone:
            # NOTE: worker i starts its sweep i / n of the way through the blocks, so the workers rarely want the
            # same block at the same time; the blocks it holds no tokens of it skips without their locks.
            start = shard.worker * nb // shard.n_workers
            ptr = st.word_ptr[shard.blocks]
            own = [j for j in (*range(start, nb), *range(start)) if ptr[j + 1] > ptr[j]]
            n0 = np.empty(K, np.int32)
        for c in range(first, first + count):
            shard.clock = c
            rng = _rng_state(shard.sweep_seed())
            st.begin_sweep()
            if alone:
                st.sweep_words(0, V, rng)
            else:
                todo = own
                while todo:
                    held = []
                    for j in todo:
                        if _take_block(locks, j, shard.worker + 1, tab_k, st.n_k, n0):
                            rng = st.sweep_words(shard.blocks[j], shard.blocks[j + 1], rng)
                            _give_block(locks, j, shard.worker + 1, table, V * K, st.n_k, n0)
                        else:
                            held.append(j)
                    if len(held) == len(todo):  # every block left is held: let the others run
                        os.sched_yield()
                    todo = held
            st.end_sweep()

    def in_place_words(self, n_workers: int) -> int:
        """How many int32 words :meth:`local_steps` needs shared between ``n_workers`` workers: a lock per block, and
        for the word kernel its lists of each word's topics (V x K topics, then V counts)."""
        lists = -(-self.V * self.K * _list_dtype(self.K).itemsize // 4) + self.V if self.kernel == "word" else 0
        return len(self._word_blocks(n_workers)) - 1 + lists

    def _word_lists(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The word kernel's lists (V x K topics, V counts) laid out in the int32 ``words`` (see in_place_words)."""
        V, K = self.V, self.K
        return words[:-V].view(_list_dtype(K))[:V * K].reshape(V, K), words[-V:]

    def _word_blocks(self, n_workers: int) -> np.ndarray:
        """Word boundaries of the in-place blocks: about ``sync_every`` tokens of each of ``n_workers`` workers,
        fewer where that would leave under 4 blocks a worker (the words permitting): a worker that finds the next
        block held takes another. They cut the word-major tokens into runs of about ``tokens`` each."""
        word_ptr = np.concatenate([[0], np.cumsum(np.bincount(self.corpus.words, minlength=self.V))])
        tokens = min(self.sync_every * n_workers, self.corpus.n_tokens // (4 * n_workers))
        return np.array(blocks(word_ptr, 0, self.V, tokens), np.int64)

    def device_steps(self, table: Any, shard: LDAShard, first: int, count: int, batch_size: int, lr: float) -> None:
        """The gpu substrate's hook: sweeps first .. first+count-1 with ``batch_size`` tokens of each document in
        flight (``device_kernel`` 'auto' or 'hogwild'), or in batches of ``batch_size`` tokens, each drawn at once
        against one read of the table ('fused', 'array'); see :mod:`simlib.problems.lda_device`. ``lr`` is unused."""
        from simlib.problems.lda_device import device_sweeps

        device_sweeps(self, table, shard, first, count, batch_size)

    def local_result(self, shard: LDAShard) -> np.ndarray:
        """What a worker sends back at the end of a real run: its tokens' topics z (corpus order)."""
        if shard.device is not None:
            return to_numpy(shard.device.z).astype(np.int32)
        return shard.state.z

    def assignments(self, result: Any) -> np.ndarray:
        """Every token's topic after a run on a real substrate (the workers' topics, put back in corpus order)."""
        parts = result.measured.get("local")
        if not parts:
            raise ValueError("result: it holds no workers' assignments; run on a real substrate "
                             "(pipes, shm, gpu or ray)")
        z = np.empty(self.corpus.n_tokens, np.int32)
        for tokens, part in zip(self._tokens(deal_documents(self.corpus, len(parts))), parts):
            z[tokens] = part
        return z

    def _tokens(self, dealt: list[np.ndarray]) -> list[np.ndarray]:
        """The corpus positions of each worker's tokens, in its shard's order (``dealt``: each worker's documents)."""
        off = self.corpus.offsets
        return [np.concatenate([np.arange(off[d], off[d + 1]) for d in own]) for own in dealt]

    def log_likelihood(self, params: np.ndarray, z: np.ndarray) -> float:
        """The full log p(w, z): the table's word part plus the doc part of the assignments ``z``."""
        n_dk = doc_topic_counts(self.corpus, z, self.K)
        n_wk, n_k = self.split(params)
        return log_likelihood(n_dk, n_wk.astype(np.int64), n_k.astype(np.int64), self.alpha, self.beta)

    def split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The table as (n_wk (V, K), n_k (K,)) views."""
        return params[:-self.K].reshape(self.V, self.K), params[-self.K:]

    def quality(self, params: np.ndarray) -> float:
        """log p(w | z) of the table: the word part of the joint likelihood."""
        n_wk, n_k = self.split(to_numpy(params))
        return word_log_likelihood(n_wk, n_k, self.beta)

    def check_counts(self, params: np.ndarray) -> None:
        """Raise AssertionError unless the table holds the corpus: whole n_wk >= 0 summing to N, n_k its column sums."""
        n_wk, n_k = self.split(params)
        assert n_wk.min() >= 0, "a word-topic count went negative"
        assert np.array_equal(n_wk, np.round(n_wk)), "a word-topic count is not a whole number"
        assert n_wk.sum() == self.corpus.n_tokens, f"n_wk sums to {n_wk.sum()}, not N = {self.corpus.n_tokens}"
        assert np.array_equal(n_k, n_wk.sum(axis=0)), "n_k differs from the column sums of n_wk"


@njit(cache=True, nogil=True)
def _take_block(locks, j, me, tab_k, n_k, n0):  # pragma: no cover - compiled
    """Take block j's lock for worker ``me`` (>= 1) if it is free, then read n_k (into n_k and n0); False if held."""
    if not compare_swap(locks, j, 0, me):
        return False
    for k in range(n_k.shape[0]):
        n_k[k] = n0[k] = tab_k[k]
    return True


@njit(cache=True, nogil=True)
def _give_block(locks, j, me, table, at, n_k, n0):  # pragma: no cover - compiled
    """Add n_k's change since :func:`_take_block` to table[at:] atomically, then free block j (held by ``me``)."""
    for k in range(n_k.shape[0]):
        if n_k[k] != n0[k]:
            atomic_add(table, at + k, n_k[k] - n0[k])
    compare_swap(locks, j, me, 0)


@njit(cache=True, nogil=True)
def _load_counts(values, own_wk, own_k, words, n_wk, n_k, before):  # pragma: no cover - compiled
    """Load a read into the worker's tables: n_wk[words[i]] = max(read row i, own row i), n_k likewise;
    ``before`` = the loaded counts."""
    n, K = own_wk.shape
    for i in range(n + 1):  # the rows of the shard's words, then n_k
        row, own = (n_wk[words[i]], own_wk[i]) if i < n else (n_k, own_k)
        for k in range(K):
            c = max(np.int32(values[i * K + k]), own[k])
            row[k] = c
            before[i * K + k] = c


@njit(cache=True, nogil=True)
def _moved_counts(table, words, before, keys, own):  # pragma: no cover - compiled
    """The sweep's moves: (keys, count deltas) where the tables changed, also added to the own counts.

    ``table`` = (n_wk, n_k) after the sweep, ``own`` = the worker's own (rows, n_k), updated here.
    """
    (n_wk, n_k), (own_wk, own_k) = table, own
    n, K = own_wk.shape
    out_keys = np.empty(len(keys), np.int64)
    deltas = np.empty(len(keys), np.float64)
    m = 0
    for i in range(n + 1):  # the rows of the shard's words, then n_k
        row, mine = (n_wk[words[i]], own_wk[i]) if i < n else (n_k, own_k)
        for k in range(K):
            d = row[k] - before[i * K + k]
            if d != 0:
                mine[k] += d
                out_keys[m] = keys[i * K + k]
                deltas[m] = d
                m += 1
    return out_keys[:m], deltas[:m]


__all__ = ["LDAProblem", "LDAShard"]

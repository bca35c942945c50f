"""The fast single-process collapsed Gibbs sampler for LDA (the baseline every substrate runs).

Five compiled sweeps share one state (:class:`GibbsState`):

* ``dense``: the textbook sampler. For each token, in document order, build the K-term
  cumulative sum of (n_dk + a)(n_wk + b)/(n_k + V b) and invert it: O(K) per token.
* ``sparse`` (the default): exact Gibbs with the conditional split in two, visiting tokens
  word by word (the decomposition of SparseLDA and F+LDA, with w fixed for a run of tokens):

      p(k) ∝ n_dk * phi_w(k)   +   a * phi_w(k),      phi_w(k) = (n_wk + b) / (n_k + V b)
             (doc part: only the topics present in d)  (word part: all K topics, same for every
                                                        token of word w)

  The doc part is summed over the document's non-zero topics (a list per document, kept
  roughly sorted by count; about 10 entries at K = 20 and 25-30 at K = 100 on the KJV
  chapters, not K). The word part's total is kept as a running sum, updated in O(1) when a
  token moves (only phi_w of the old and new topic change, because w is fixed); it is drawn
  5-10% of the time and then found by a linear scan over K. The chain is the same as the
  dense one (only the order in which tokens are visited differs), so the log-likelihood per
  sweep matches the `lda` package's.

* ``mh``: LightLDA's Metropolis-Hastings sampler (Yuan et al. 2015), O(1) per token whatever K.
  Each token runs 4 cycles of two cheap proposals, each accepted by an MH test against the
  exact conditional above:

      word proposal  q_w(k) ∝ (n_wk + b) / (n_k + V b)   from an alias table built once per
                     sweep for word w, at the start of its run (stale within the run; the test
                     uses the values the table was built with), its sparse part over the
                     topics with n_wk > 0 and its b-part over all K topics shared by every word;
      doc proposal   q_d(k) ∝ n_dk + a                    with probability (L_d - 1)/(L_d - 1 + K a)
                     the topic of another token of d, picked uniformly, else a uniform topic:
                     no table, always fresh.

  The stale table counts the token itself; drawing from it and evaluating it as if it did not
  (one rejection when the draw is the token's own topic) keeps the proposal independent of the
  token's own topic, which would otherwise sharpen the chain toward its current topic. What
  remains stale is the other tokens' moves since the sweep (n_k) or the word's run (n_wk)
  began, as in LightLDA; the tests check the per-token step against the exact conditional.
  That rejection gives up after 16 tries (the token stays for that cycle): at a tiny beta a word
  whose only token is this one needed ~1/beta tries, and the sweep never ended.

* ``alias``: AliasLDA (Li, Ahmed, Ravi, Smola, KDD 2014). The same split as ``sparse``, but the
  word part is drawn in O(1) from a stale alias table and a Metropolis-Hastings test corrects
  for the staleness. Each token runs 2 MH steps with the proposal

      q(k) ∝ n_dk * phi_w(k)           +   a * q_w(k)
             (doc part: exact, fresh,       (word part: the stale table of ``mh``, the token taken out:
              over d's topic list)           q_w(k) = (n'_wk + b) / (n'_k + V b), n' the counts it was built from)

  accepted with min(1, p(t) q(s) / (p(s) q(t))), p the exact conditional. A word's table is
  built at the start of its run in every sweep (from n_wk now, n_k at the sweep's start or its
  last rebuild) and rebuilt within the run, n_k's table too, after it has served K draws, so
  its O(K) build costs O(1) per draw.
  The proposal is the exact conditional but for the word part's staleness, so most proposals
  are accepted (on the KJV, of those that would move the token: 96-99% at K = 100; at K = 1,000
  75% in the first sweep from a random start, 91-93% from the fourth) and the chain keeps the
  exact sampler's pace per sweep: log p after 10 sweeps on 300 KJV chapters at K = 1,000 within
  0.3% of ``sparse``'s (``mh``: 4.4-4.6% behind).

* ``word``: the exact conditional split the other way, by the word's topics (SparseLDA's word bucket), which the
  word-major order keeps at hand: p(k) ∝ (n_dk + a) n_wk / (n_k + V b) + b (n_dk + a) / (n_k + V b). The first
  part is summed fresh over the topics with n_wk > 0 (a list kept through the word's run: on the KJV at K = 1,000
  about 21 a token from the tenth sweep, against the 90 of a document's list that ``sparse`` and ``alias`` sum);
  the second, of mass b / (n_k + V b) per unit of n_dk + a, is proposed as b c (n_dk + a), c the mean of
  1 / (n_k + V b), by the doc proposal of ``mh`` (no table). One MH step, accepted with
  min(1, p(t) q(s) / (p(s) q(t))), corrects the proposal where it differs from p: at the topics the word does not
  use, a share of order b of the mass, so nearly every proposal is taken and the chain keeps exact Gibbs's pace
  per sweep (KJV, K = 1,000, 30 sweeps: log p per token -9.092 to -9.096 against sparse's -9.094) at under half
  the alias kernel's CPU per token (30 sweeps on one busy core, one after the other: 1.8-2.4 against 4.3 s). Its
  tables are the counts themselves, fresh, so it needs no stale-table bookkeeping; it reads n_dk dense, as ``mh``
  does. Timed to tomotopy's 30-sweep log p (``benchmarks/lda.py --time-to-target``) it is the fastest kernel here.

Why sparse is the default (measured on the KJV chapters, 278 k tokens, one core of a busy 2-core
machine): the dense sweep runs at ~13 M tokens/s at K = 20 but ~4.9 M at K = 100; the sparse
sweep ran at 20 M (K = 20) and 11.8 M (K = 100) over 100 sweeps from a random start, level
with tomotopy measured in the same run (20.2 M and 11.1 M; ``benchmarks/lda.py``), because
its cost grows with the topics a document uses, not with K. A sum tree over K for the word
part (as in F+LDA) measured no faster here (6-8 M tokens/s at K = 100 either way, under the
same load) while costing O(log K) per move, so the simpler running sum stayed. The MH sampler
is not exact Gibbs: its chain mixes more slowly per sweep, so its likelihood after a given
number of sweeps lags the exact chain's; it pays off at large K (``benchmarks/lda.py --kernels``).
The alias sampler's cost per token still follows the topics a document uses (its doc part, as
sparse's), without sparse's O(K) scan of the word part: on the KJV from a random start, 1.5-1.7x
sparse's CPU per token at K = 100, level at K = 1,000 (0.9-1.2x) and 3.1x cheaper at K = 10,000,
where mh is 1.2-1.3x cheaper still (2-3 sweeps after the first, one core of a busy machine).

Example::

    >>> from simlib.problems.lda import make_synthetic_corpus
    >>> corpus, phi, _ = make_synthetic_corpus(n_docs=100, n_topics=5, n_words=100, doc_length=50, seed=0)
    >>> state = GibbsState.init(corpus, n_topics=5, alpha=0.1, beta=0.01, seed=0)
    >>> for s in range(3):
    ...     state.sweep(seed=s)
    >>> state.check_counts()  # the tables still equal the counts of the assignments
"""
from __future__ import annotations

import time

import numpy as np
from numba import njit

from simlib import _validate as check
from simlib.problems.lda import (LDACorpus, check_corpus, check_hyper, count_tables, doc_topic_counts, log_likelihood,
                                random_assignments, word_counts)

KERNELS = ("sparse", "dense", "mh", "alias", "word")
# The kernels' arguments travel in tuples (numba unpacks them at no cost), grouped by what they describe:
Tokens = tuple  # word-major tokens: (word_ptr, doc, z), for mh followed by (order, offsets, z_doc)
Lists = tuple  # the sparse kernels' per-document topic lists: (idx, cnt, length, pos), each D x K but length
Table = tuple  # the word-topic counts the sweep reads and updates: (n_wk, n_k)
Prior = tuple  # (alpha, beta)
Run = tuple  # the tokens a..b-1 of word w and the size and masses of its stale word table: (a, b, w, (m, S, B))
# _table_buffers: (weight, b-part prob, word prob, b-part alias, word alias, word topics, Vose's two stacks, snap)
Buffers = tuple
Proposal = tuple  # a stale word table and the MH steps per token drawn from it: (buffers, n0, s_fixed, n_steps)
Mass = tuple  # a stale word table's size and masses: (m, S, B), see _word_draw
# NOTE: the arrays of a stale table (Proposal) travel apart from its masses, in a tuple built once per sweep, not per
# word: a tuple of arrays built per word cost the mh kernel 3-4% at K = 1,000 (205 against 197 ns per token, paired).
Work = tuple  # the alias kernel's K-long work arrays: (cdf, 1 / (n_k + V b), phi_w)
# NOTE: word-then-doc cycles per token. LightLDA's default is 2; 4 measured better per unit of time
# here: on the default 8-topic synthetic corpus 2 of 12 random starts still had two true topics merged
# after 50 sweeps with 2 cycles (0 of 12 with 4, and 0 of 12 for exact Gibbs), and on the KJV at K = 1,000
# log p(w, z) after 30 sweeps trailed the sparse sampler's by 3.6% with 2 cycles, 1.4% with 4, for
# 36 against 59 ms of CPU per sweep (sparse: 77 ms). More cycles close the gap only at more than the exact
# sampler's cost (KJV, K = 1,000, 30 sweeps, log p per token against sparse's -9.094 at 339 ns CPU per token:
# 4 cycles -9.221 at 226 ns, 8 -9.140 at 386 ns); fresher word tables (rebuilt with n_k
# after every K tokens of a word, as the alias kernel does) did not help (-9.241 with 4 cycles, -9.154 with 6).
# Timed to a log-likelihood (tomotopy's after 30 sweeps, KJV, K = 1,000; benchmarks/lda.py --time-to-target) the
# cycles trade sweeps for cost per sweep: 2, 3, 4 and 8 cycles reached it at sweeps 56, 47, 39 and 33, in about 2.8,
# 3.0, 3.5 and 4.4 CPU s (1 cycle: not by sweep 80). The default stays 4; GibbsState and LDAProblem take ``mh_steps``.
MH_STEPS = 4
# The most cycles a token may take. At 8 the chain is within 0.5% of exact Gibbs (above); past 64 a sweep costs many
# exact ones ('sparse'), and mh_steps=10**9 made one token's step last minutes, out of Ctrl-C's and timeout='s reach.
MAX_MH_STEPS = 64
# NOTE: MH steps per token of the alias kernel. On the KJV from a random start, log p per token after 10 sweeps
# with 1, 2 and 4 steps: -8.576, -8.569, -8.601 at K = 100 (sparse: -8.598) for 115, 141, 204 ns per token; at
# K = 1,000 -9.671, -9.593, -9.590 (sparse: -9.569) for 325, 343, 493 ns. One step trails at K = 1,000, four cost
# 40% more for nothing.
_ALIAS_STEPS = 2
# NOTE: MH steps per token of the word kernel. Its proposal is the conditional but for topics the word does not use, so
# nearly every proposal is accepted and one step does what two do: KJV, K = 1,000, log p per token after 30 sweeps
# -9.0963 with 1 step, -9.0958 with 2 (sparse: -9.0935), for 2.03 against 2.36 s of CPU (paired, one busy core).
_WORD_STEPS = 1
# NOTE: rejection tries of a stale word draw before it gives up. A try fails only when it draws the token's
# own topic s_tab and the thinning rejects it, with probability about 1 - (snap - 1 + b) / (snap + b): near 1 - b for
# a word whose only token of s_tab is this one, so at b = 1e-9 the unbounded loop needed ~1e9 tries per token and
# never finished. After 16 failed tries the mh kernel's word proposal stays put and the alias kernel draws exactly in
# O(K) (its mixture's word part must be q_j). NOTE: the O(K) draw sits at the alias kernel's call, not inside
# _word_draw: inlined into the mh kernel's four cycles it doubled its CPU per token (KJV, K = 100: 365-450 against
# 166-178 ns); as it is, both kernels cost what they did before (mh 175 and 225 ns at K = 100 and 1,000, alias 175
# and 333 ns; paired runs on a busy machine).
_WORD_TRIES = 16
# The smallest alpha and beta the MH kernels take. Their acceptance tests multiply a target and a proposal value,
# each as small as alpha beta / (N + V beta) for N tokens: below ~1e-150 the products underflow to 0, no move is
# ever accepted and the chain stops (alias at beta = 1e-300: one topic in 50,000 draws). At 1e-100 they stay above
# 1e-216 for corpora of up to 1e10 tokens; the exact kernels (sparse, dense) take any positive prior.
MIN_MH_PRIOR = 1e-100
# NOTE: tokens per compiled sweep call (GibbsState.sweep_words), whole words: a signal handler (Ctrl-C, a worker's
# SIGTERM at the run's timeout) runs only between compiled calls, and one call per sweep kept it waiting a whole sweep
# (4 M tokens, K = 20, mh: 3.8-4.2 s on a busy 2-core machine; now 0.07-0.17 s, sparse 0.005-0.034 s). Same chain to
# the bit, same CPU per token (paired runs, 1.2 M tokens, K = 100: within the runs' +-15% noise).
BLOCK = 1 << 18
# NOTE: every kernel here compiles with error_model="numpy": a float division then carries no test for a zero
# divisor (numba's default raises ZeroDivisionError, a branch on every division; the divisors here are counts
# + V b or sums of positive weights, never 0). Same draws, same chains; KJV, K = 1,000, CPU per token, best of 10
# sweeps, three paired runs: mh 196.6-197.5 ns against 206.5-212.8, sparse 272.7-275.6 against 279.3-284.5.


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _uniform(state: np.uint64) -> tuple[np.uint64, float]:
    """xorshift64* step: the new state and a uniform draw in [0, 1)."""
    # NOTE: replaces np.random.random() (numba's Mersenne Twister) in the inner loop: 17 -> 4 ns
    # per draw measured on a busy core; numba's generator state would also be global per process.
    state ^= state >> np.uint64(12)
    state ^= state << np.uint64(25)
    state ^= state >> np.uint64(27)
    return state, float((state * np.uint64(2685821657736338717)) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True, error_model="numpy")
def _sweep_dense(tokens: Tokens, n_dk: np.ndarray, table: Table, prior: Prior, w_lo: int, w_hi: int,
                 rng: np.uint64, carry: None = None) -> np.uint64:
    """Words w_lo..w_hi-1 of one O(K)-per-token sweep: build the cumulative (n_dk + a)(n_wk + b)/(n_k + V b), invert it.

    ``carry`` is unused: the other sweeps' state carried between calls (GibbsState.sweep_words calls them alike)."""
    word_ptr, doc, z = tokens[:3]
    (n_wk, n_k), (alpha, beta) = table, prior
    V, K = n_wk.shape
    vbeta = V * beta
    cdf = np.empty(K)
    for w in range(w_lo, w_hi):
        for j in range(word_ptr[w], word_ptr[w + 1]):
            d = doc[j]
            k = z[j]
            n_dk[d, k] -= 1
            n_wk[w, k] -= 1
            n_k[k] -= 1
            total = 0.0
            for kk in range(K):
                total += (n_dk[d, kk] + alpha) * (n_wk[w, kk] + beta) / (n_k[kk] + vbeta)
                cdf[kk] = total
            rng, u = _uniform(rng)
            u *= total
            k = 0
            while k < K - 1 and cdf[k] <= u:
                k += 1
            z[j] = k
            n_dk[d, k] += 1
            n_wk[w, k] += 1
            n_k[k] += 1
    return rng


def blocks(ptr: np.ndarray, lo: int, hi: int, size: int | None = None) -> list[int]:
    """Boundaries lo = b_0 < b_1 < ... = hi cutting items lo..hi-1 (item i holds tokens ptr[i]..ptr[i+1]-1) into runs
    of about ``size`` (default BLOCK) tokens, each a compiled call (an item longer than that is a run of its own)."""
    size = max(1, BLOCK if size is None else size)
    if ptr[hi] - ptr[lo] <= size:  # one run (the in-place path's blocks): no search
        return [lo, hi]
    cuts = np.searchsorted(ptr, np.arange(ptr[lo] + size, ptr[hi], size)).tolist()
    return [lo, *sorted({c for c in cuts if lo < c < hi}), hi]


def check_prior(kernel: str, n_topics: int, alpha: float, beta: float, mh_steps: int = MH_STEPS) -> None:
    """ValueError naming the field: K >= 2, alpha, beta > 0 (>= MIN_MH_PRIOR for mh and alias), a known kernel,
    mh_steps an integer in [1, MAX_MH_STEPS]."""
    check_hyper(n_topics, alpha, beta)
    check.one_of("kernel", kernel, KERNELS)
    if kernel in ("mh", "alias", "word"):
        for name, value in (("alpha", alpha), ("beta", beta)):
            if value < MIN_MH_PRIOR:
                raise ValueError(f"{name} must be >= {MIN_MH_PRIOR:g} with kernel {kernel!r}, got {value:g}: its "
                                 "Metropolis-Hastings test multiplies probabilities of that order, which underflow "
                                 "below; kernel 'sparse' (exact) takes any positive value")
    if not check._is_int(mh_steps) or not 1 <= mh_steps <= MAX_MH_STEPS:
        raise ValueError(f"mh_steps must be an integer in [1, {MAX_MH_STEPS}] (the mh kernel's cycles per token; "
                         f"past {MAX_MH_STEPS} use kernel 'sparse', exact Gibbs), got {mh_steps!r}")


def _rng_state(seed: int) -> np.uint64:
    """A non-zero 64-bit xorshift state from any integer seed (splitmix64 finaliser)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return np.uint64((x ^ (x >> 31)) or 1)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _list_take(d: int, k: int, lists: Lists) -> None:
    """n_dk[d, k] -= 1 on document d's topic list; at 0, k leaves it (the last entry moves into its slot)."""
    idx, cnt, length, pos = lists
    i = pos[d, k]
    cnt[d, i] -= 1
    if cnt[d, i] == 0:
        L = length[d] - 1
        last = idx[d, L]
        idx[d, i] = last
        cnt[d, i] = cnt[d, L]
        pos[d, last] = i
        pos[d, k] = -1
        length[d] = L


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _sweep_sparse(tokens: Tokens, lists: Lists, table: Table, prior: Prior, w_lo: int, w_hi: int, rng: np.uint64,
                  carry: None = None) -> np.uint64:
    """Words w_lo..w_hi-1 of one exact sweep: doc part over the document's topic list, word part by a running sum."""
    word_ptr, doc, z = tokens[:3]
    dk_idx, dk_cnt, dk_len, dk_pos = lists
    (n_wk, n_k), (alpha, beta) = table, prior
    V, K = n_wk.shape
    vbeta = V * beta
    inv = np.empty(K)  # 1 / (n_k + V b): divisions hoisted out of the inner loops
    for k in range(K):
        inv[k] = 1.0 / (n_k[k] + vbeta)
    phi = np.empty(K)  # phi_w(k) for the current word
    for w in range(w_lo, w_hi):
        a, b = word_ptr[w], word_ptr[w + 1]
        if a == b:
            continue
        wsum = 0.0  # sum_k phi_w(k), kept exact up to rounding by O(1) updates
        for k in range(K):
            phi[k] = (n_wk[w, k] + beta) * inv[k]
            wsum += phi[k]
        for j in range(a, b):
            d = doc[j]
            k = z[j]
            # Take the token out of the counts (only phi_w(k) and the sum change).
            n_wk[w, k] -= 1
            n_k[k] -= 1
            inv[k] = 1.0 / (n_k[k] + vbeta)
            old = phi[k]
            phi[k] = (n_wk[w, k] + beta) * inv[k]
            wsum += phi[k] - old
            _list_take(d, k, lists)
            # Doc part: sum over the topics document d uses.
            # NOTE: summed without a cumulative array, which fast math then adds in several chains at once, and
            # scanned again from the front only when drawn: a cdf stored per entry was one chain of dependent adds.
            L = dk_len[d]
            total = 0.0
            for i in range(L):
                total += dk_cnt[d, i] * phi[dk_idx[d, i]]
            rng, u = _uniform(rng)
            u *= total + alpha * wsum
            if u < total:
                # The list is kept roughly sorted by count (below), so this scan stops early.
                i = 0
                acc = dk_cnt[d, 0] * phi[dk_idx[d, 0]]
                while i < L - 1 and acc <= u:
                    i += 1
                    acc += dk_cnt[d, i] * phi[dk_idx[d, i]]
                k = dk_idx[d, i]
            else:
                # Word part, drawn 5-10% of the time: a linear scan over K is cheap on average.
                u = (u - total) / alpha
                k = 0
                acc = phi[0]
                while k < K - 1 and acc <= u:
                    k += 1
                    acc += phi[k]
            # Put it back under topic k.
            # NOTE: inline, not shared with the alias kernel as _list_take is: as a helper (even inline="always")
            # this step made the sweep 25% slower at K = 100 (95 -> 123 ns per token, same chain), _list_take 0%.
            z[j] = k
            i = dk_pos[d, k]
            if i < 0:
                i = dk_len[d]
                dk_pos[d, k] = i
                dk_idx[d, i] = k
                dk_cnt[d, i] = 0
                dk_len[d] = i + 1
            dk_cnt[d, i] += 1
            if i > 0 and dk_cnt[d, i] > dk_cnt[d, i - 1]:  # one bubble step toward count order
                prev = dk_idx[d, i - 1]
                dk_idx[d, i - 1], dk_idx[d, i] = k, prev
                dk_cnt[d, i - 1], dk_cnt[d, i] = dk_cnt[d, i], dk_cnt[d, i - 1]
                dk_pos[d, k], dk_pos[d, prev] = i - 1, i
            n_wk[w, k] += 1
            n_k[k] += 1
            inv[k] = 1.0 / (n_k[k] + vbeta)
            old = phi[k]
            phi[k] = (n_wk[w, k] + beta) * inv[k]
            wsum += phi[k] - old
    return rng


@njit(cache=True, nogil=True, error_model="numpy")
def _alias_build(weight: np.ndarray, n: int, prob: np.ndarray, alias: np.ndarray, small: np.ndarray,
                 large: np.ndarray) -> float:
    """Vose's alias table for weight[:n]: slot i keeps i with probability prob[i], else gives alias[i]; returns
    the weights' sum."""
    total = 0.0
    for i in range(n):
        total += weight[i]
    scale = n / total
    ns = nl = 0
    for i in range(n):
        prob[i] = weight[i] * scale
        alias[i] = i
        if prob[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        sm = small[ns]
        lg = large[nl - 1]
        alias[sm] = lg
        prob[lg] -= 1.0 - prob[sm]
        if prob[lg] < 1.0:  # the donor fell below one slot: it moves from the large to the small stack
            nl -= 1
            small[ns] = lg
            ns += 1
    for i in range(nl):
        prob[large[i]] = 1.0
    for i in range(ns):  # rounding leftovers
        prob[small[i]] = 1.0
    return total


@njit(cache=True, nogil=True, error_model="numpy")
def _beta_table(n0: np.ndarray, beta: float, vbeta: float, bufs: Buffers) -> float:
    """The b-part of q_w, shared by every word: alias table over K with weights b / (n0_k + V b); returns their sum."""
    weight, prob, _, alias, _, _, small, large, _ = bufs
    for k in range(n0.shape[0]):
        weight[k] = beta / (n0[k] + vbeta)
    return _alias_build(weight, n0.shape[0], prob, alias, small, large)


@njit(cache=True, nogil=True, error_model="numpy")
def _word_table(row: np.ndarray, n0: np.ndarray, vbeta: float, bufs: Buffers) -> tuple[int, float]:
    """The sparse part of q_w: alias table over the m topics with n_wk > 0, weights n_wk / (n0_k + V b); (m, their sum).

    ``snap`` keeps the row as it was, for the acceptance test.
    """
    weight, _, prob, _, alias, topic, small, large, snap = bufs
    m = 0
    for k in range(row.shape[0]):
        c = row[k]
        snap[k] = c
        if c > 0:
            topic[m] = k
            weight[m] = c / (n0[k] + vbeta)
            m += 1
    return m, _alias_build(weight, m, prob, alias, small, large) if m > 0 else 0.0


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _word_draw(rng: np.uint64, prop: Proposal, mass: Mass, s_tab: int, beta: float,
               vbeta: float) -> tuple[np.uint64, int]:
    """A draw from the stale word table without the token: q_j(k) ∝ (snap_k - [k=s_tab] + b) / (n0_k - [k=s_tab] + V b).

    The table (sparse part of mass S over wtopic[:m], b-part of mass B over all K) counts the
    token under s_tab; a draw of s_tab is kept with probability q_j(s_tab) / q_table(s_tab). After
    _WORD_TRIES rejections it gives up and returns t = -1, which costs at most that many tries a draw; a try
    that ends is already a draw of q_j, so a draw that does not give up is one of q_j.
    """
    (_, dprob, wprob, dalias, walias, wtopic, _, _, snap), n0 = prop[:2]
    m, S, B = mass
    K = n0.shape[0]
    for _ in range(_WORD_TRIES):
        rng, u = _uniform(rng)
        x = u * (S + B)
        if x < S:
            x *= m / S
            i = min(int(x), m - 1)
            t = wtopic[i if x - i < wprob[i] else walias[i]]
        else:
            x = min((x - S) / B, 1.0) * K
            i = min(int(x), K - 1)
            t = i if x - i < dprob[i] else dalias[i]
        if t != s_tab:
            return rng, t
        rng, u = _uniform(rng)
        if u * (snap[t] + beta) * (n0[t] - 1 + vbeta) < (snap[t] - 1 + beta) * (n0[t] + vbeta):
            return rng, t
    return rng, -1


@njit(cache=True, nogil=True, error_model="numpy")
def _word_draw_exact(rng: np.uint64, snap: np.ndarray, n0: np.ndarray, s_tab: int, beta: float,
                     vbeta: float) -> tuple[np.uint64, int]:
    """An O(K) draw from q_j(k) ∝ (snap_k - [k=s_tab] + b) / (n0_k - [k=s_tab] + V b), by its cumulative sum."""
    K = n0.shape[0]
    total = 0.0
    for k in range(K):
        total += _stale_q(k, snap, n0, s_tab, beta, vbeta)
    rng, u = _uniform(rng)
    x = u * total
    k = 0
    acc = _stale_q(0, snap, n0, s_tab, beta, vbeta)
    while k < K - 1 and acc <= x:
        k += 1
        acc += _stale_q(k, snap, n0, s_tab, beta, vbeta)
    return rng, k


@njit(cache=True, nogil=True, error_model="numpy")
def _word_mass(prop: Proposal, mass: Mass, s_tab: int, beta: float, vbeta: float) -> float:
    """sum_k q_j(k): the stale table's S + B with the token's entry at s_tab replaced by q_j(s_tab)."""
    # NOTE: each part less its own share of s_tab, and not fastmath (which may reassociate the sum): at beta < 1e-16
    # B is below S's rounding, so (S + B) - (snap + b) / (n0 + V b) keeps S's rounding error (~1e-17) for a mass of
    # order beta. For a word whose tokens are all under s_tab, S less its one entry is exactly 0 this way (the same
    # division as in _word_table).
    snap, n0 = prop[0][_SNAPSHOT], prop[1]
    _, S, B = mass
    den = n0[s_tab] + vbeta
    return (S - snap[s_tab] / den) + (B - beta / den) + _stale_q(s_tab, snap, n0, s_tab, beta, vbeta)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _doc_topic(x: float, n_other: int, lo: int, p: int, z_doc: np.ndarray, alpha: float, K: int) -> int:
    """The doc proposal's topic for x uniform on [0, n_other + K alpha): another token's of the document (token p
    skipped), or a uniform topic."""
    if x < n_other:
        q = lo + int(x)
        return z_doc[q + 1 if q >= p else q]
    return min(int((x - n_other) / alpha), K - 1)


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _stale_q(k: int, snap: np.ndarray, n0: np.ndarray, s_tab: int, beta: float, vbeta: float) -> float:
    """The stale word proposal without the token, unnormalised: (snap_k - [k=s_tab] + b) / (n0_k - [k=s_tab] + V b)."""
    own = int(k == s_tab)
    return (snap[k] - own + beta) / (n0[k] - own + vbeta)


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _mh_run(run: Run, tokens: Tokens, n_dk: np.ndarray, table: Table, prior: Prior, prop: Proposal,
            rng: np.uint64) -> np.uint64:
    """Resample tokens a..b-1 (all of word w), run = (a, b, w, mass), by n_steps MH cycles of word then doc proposal.

    The word proposal is the stale table ``prop`` (snap, n0), which counts each token under the topic
    s_tab it had when the table was built (its topic on entry, or prop's ``s_fixed`` if >= 0):
    q_j(k) ∝ (snap_k - [k = s_tab] + b) / (n0_k - [k = s_tab] + V b) is that table without the
    token, drawn by rejecting a draw of s_tab with probability 1 - q_j(s_tab) / q_table(s_tab).
    """
    # NOTE: one call per word with the token loop inside, not one call per token: a per-token
    # helper (even inline="always") cost ~100 ns in reference counts of its 13 array arguments.
    (a, b, w, mass), (_, doc, z, order, offsets, z_doc) = run, tokens
    (n_wk, n_k), (alpha, beta) = table, prior
    snap, n0, s_fixed, n_steps = prop[0][_SNAPSHOT], prop[1], prop[2], prop[3]
    V, K = n_wk.shape
    vbeta = V * beta
    for j in range(a, b):
        d = doc[j]
        s = z[j]
        s_tab = s if s_fixed < 0 else s_fixed
        n_dk[d, s] -= 1
        n_wk[w, s] -= 1
        n_k[s] -= 1
        p, lo = order[j], offsets[d]
        n_other = offsets[d + 1] - lo - 1  # the other tokens of document d
        ps = (n_dk[d, s] + alpha) * (n_wk[w, s] + beta) / (n_k[s] + vbeta)
        # NOTE: n_steps is a run-time value: with the constant MH_STEPS here, numba unrolled the loop and the
        # kernel ran 3% slower (KJV, K = 1,000: 209 against 202 ns per token, paired runs).
        for _ in range(n_steps):
            # Word proposal: sparse part (mass S) or b-part (mass B), alias draws from one uniform each.
            rng, t = _word_draw(rng, prop, mass, s_tab, beta, vbeta)
            # A draw that gave up (t < 0) leaves the token where it is: how often that happens depends on the table
            # and s_tab alone, not on s, so the step is "stay, or an MH step from q_j": both keep p invariant.
            if t != s and t >= 0:
                pt = (n_dk[d, t] + alpha) * (n_wk[w, t] + beta) / (n_k[t] + vbeta)
                qs = _stale_q(s, snap, n0, s_tab, beta, vbeta)
                qt = _stale_q(t, snap, n0, s_tab, beta, vbeta)
                rng, u = _uniform(rng)
                if u * ps * qt < pt * qs:  # accept with min(1, p(t) q(s) / (p(s) q(t)))
                    s, ps = t, pt
            # Doc proposal: another token's topic, or a uniform one; q_d(k) ∝ n_dk + a with fresh counts.
            rng, u = _uniform(rng)
            t = _doc_topic(u * (n_other + K * alpha), n_other, lo, p, z_doc, alpha, K)
            if t != s:
                pt = (n_dk[d, t] + alpha) * (n_wk[w, t] + beta) / (n_k[t] + vbeta)
                rng, u = _uniform(rng)
                if u * ps * (n_dk[d, t] + alpha) < pt * (n_dk[d, s] + alpha):
                    s, ps = t, pt
        z[j] = s
        z_doc[p] = s
        n_dk[d, s] += 1
        n_wk[w, s] += 1
        n_k[s] += 1
    return rng


_SNAPSHOT = 8  # the place in _table_buffers' tuple of the snapshot of the word's row


@njit(cache=True, nogil=True, error_model="numpy")
def _table_buffers(n_wk: np.ndarray) -> tuple[np.ndarray, ...]:
    """Work arrays of length K for the alias tables: weight, b-part prob, word prob, b-part alias, word alias,
    word topics, Vose's two stacks, and the snapshot of the word's row (n_wk's dtype)."""
    K = n_wk.shape[1]
    i32 = np.int32
    return (np.empty(K), np.empty(K), np.empty(K), np.empty(K, i32), np.empty(K, i32), np.empty(K, i32),
            np.empty(K, i32), np.empty(K, i32), np.empty(K, n_wk.dtype))


@njit(cache=True, nogil=True, error_model="numpy")
def _sweep_mh(tokens: Tokens, n_dk: np.ndarray, table: Table, prior: Prior, w_lo: int, w_hi: int,
              rng: np.uint64, prop: Proposal) -> np.uint64:
    """Words w_lo..w_hi-1 of a LightLDA sweep: per word an alias table of the counts at its run's start, then MH per token.

    ``tokens`` ends with ``z_doc``, the topics in document order (:meth:`GibbsState.begin_sweep`), for the doc proposal;
    ``prop``'s n0 holds the topic totals the tables are built with (:meth:`GibbsState.sweep_words`)."""
    word_ptr, n_wk, beta = tokens[0], table[0], prior[1]
    vbeta = n_wk.shape[0] * beta
    bufs, n0 = prop[0], prop[1]
    B = _beta_table(n0, beta, vbeta, bufs)
    # NOTE: the tuple made again here with s_fixed = -1 written out, not read from the caller's: numba then folds the
    # per-token test s_fixed < 0 away. With the caller's tuple the kernel cost 15-25% more CPU (4 M tokens, K = 20,
    # three paired runs on a busy machine: 2.10-2.42 against 1.67-1.82 s a sweep).
    prop = (bufs, n0, -1, prop[3])
    for w in range(w_lo, w_hi):
        a, b = word_ptr[w], word_ptr[w + 1]
        if a == b:
            continue
        m, S = _word_table(n_wk[w], n0, vbeta, bufs)
        rng = _mh_run((a, b, w, (m, S, B)), tokens, n_dk, table, prior, prop, rng)
    return rng


# NOTE: fast math without reassociation: with it, LLVM regrouped the stale word proposal's sums and at beta < 1e-16 the
# proposal lost its b-part (1.5% total variation from the exact conditional); same CPU per token either way (KJV,
# K = 100 and 1,000, three runs each, busy machine).
@njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "arcp", "contract", "afn"}, error_model="numpy")
def _alias_run(run: Run, tokens: Tokens, lists: Lists, table: Table, prior: Prior, prop: Proposal, work: Work,
               rng: np.uint64) -> tuple[int, np.uint64]:
    """AliasLDA on tokens j, j+1, .. of word w until b or until its table has served K draws; run = (j, b, w, mass).

    Each token runs prop's n_steps MH steps, proposing from q(k) ∝ n_dk phi_w(k) + a q_w(k): the doc
    part fresh over d's topic list, q_w the stale table ``prop`` without the token (``_word_draw``; the
    table counts it under its topic on entry, or s_fixed if >= 0, as in ``_mh_run``); accepted
    with min(1, p(t) q(s) / (p(s) q(t))) against p(k) = (n_dk + a) phi_w(k). ``work`` = (cdf, inv, phi):
    inv holds 1 / (n_k + V b) and is kept up to date; cdf and phi are work space. Returns (the next
    token, the rng).
    """
    (j, b, w, mass), (_, doc, z), (cdf, inv, phi) = run, tokens[:3], work
    dk_idx, dk_cnt, dk_len, dk_pos = lists
    (n_wk, n_k), (alpha, beta) = table, prior
    snap, n0, s_fixed, n_steps = prop[0][_SNAPSHOT], prop[1], prop[2], prop[3]
    _, S, B = mass
    V, K = n_wk.shape
    vbeta = V * beta
    for k in range(K):  # O(K), as the table's build: phi_w(k) fresh, updated in O(1) when a token moves
        phi[k] = (n_wk[w, k] + beta) * inv[k]
    drawn = 0
    while j < b and drawn < K:
        d = doc[j]
        s = z[j]
        s_tab = s if s_fixed < 0 else s_fixed
        n_wk[w, s] -= 1
        n_k[s] -= 1
        inv[s] = 1.0 / (n_k[s] + vbeta)
        phi[s] = (n_wk[w, s] + beta) * inv[s]
        _list_take(d, s, lists)
        L = dk_len[d]
        P = 0.0  # the doc part's mass, sum over d's topics of n_dk phi_w(k), exact
        for i in range(L):
            P += dk_cnt[d, i] * phi[dk_idx[d, i]]
            cdf[i] = P
        Q = alpha * _word_mass(prop, mass, s_tab, beta, vbeta)  # the word part's mass
        ps, qs = _alias_pq(d, s, lists, phi, prior, vbeta, prop, s_tab)
        for _ in range(n_steps):
            rng, u = _uniform(rng)
            x = u * (P + Q)
            if x < P:  # the list is unsorted: bisect its cdf
                t = dk_idx[d, min(np.searchsorted(cdf[:L], x, side="right"), L - 1)]
            else:
                rng, t = _word_draw(rng, prop, mass, s_tab, beta, vbeta)
                if t < 0:  # the mixture's word part must be q_j itself, so here the draw is exact (O(K), rare)
                    rng, t = _word_draw_exact(rng, snap, n0, s_tab, beta, vbeta)
                drawn += 1
            if t != s:
                pt, qt = _alias_pq(d, t, lists, phi, prior, vbeta, prop, s_tab)
                rng, u = _uniform(rng)
                if u * ps * qt < pt * qs:
                    s, ps, qs = t, pt, qt
        z[j] = s
        i = dk_pos[d, s]
        if i < 0:  # s joins d's list, unsorted: the doc part's cdf is built over the whole list anyway
            i = dk_len[d]
            dk_idx[d, i], dk_cnt[d, i], dk_pos[d, s], dk_len[d] = s, 0, i, i + 1
        dk_cnt[d, i] += 1
        n_wk[w, s] += 1
        n_k[s] += 1
        inv[s] = 1.0 / (n_k[s] + vbeta)
        phi[s] = (n_wk[w, s] + beta) * inv[s]
        j += 1
    return j, rng


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def _alias_pq(d: int, k: int, lists: Lists, phi: np.ndarray, prior: Prior, vbeta: float, prop: Proposal,
              s_tab: int) -> tuple[float, float]:
    """AliasLDA's target and proposal at topic k: ((n_dk + a) phi_w(k), n_dk phi_w(k) + a q_w(k)), both unnormalised."""
    i = lists[3][d, k]
    c = lists[1][d, i] if i >= 0 else 0
    alpha, beta = prior
    return (c + alpha) * phi[k], c * phi[k] + alpha * _stale_q(k, prop[0][_SNAPSHOT], prop[1], s_tab, beta, vbeta)


@njit(cache=True, nogil=True, error_model="numpy")
def _sweep_alias(tokens: Tokens, lists: Lists, table: Table, prior: Prior, w_lo: int, w_hi: int, rng: np.uint64,
                 prop: Proposal) -> np.uint64:
    """Words w_lo..w_hi-1 of an AliasLDA sweep: a word's table is built at the start of its run and again after K draws.

    ``prop``'s n0 holds the topic totals the tables are built with, updated here at each rebuild."""
    word_ptr, (n_wk, n_k), beta = tokens[0], table, prior[1]
    vbeta = n_wk.shape[0] * beta
    bufs, n0 = prop[0], prop[1]
    B = _beta_table(n0, beta, vbeta, bufs)
    prop = (bufs, n0, -1, _ALIAS_STEPS)  # see _sweep_mh's NOTE
    work = (np.empty(n_wk.shape[1]), 1.0 / (n_k + vbeta), np.empty(n_wk.shape[1]))
    for w in range(w_lo, w_hi):
        j, b = word_ptr[w], word_ptr[w + 1]
        while j < b:  # O(K) to build, O(1) per draw: rebuilt after K draws keeps the building O(1) per draw
            if j > word_ptr[w]:
                # Rebuilt within the run: n_k afresh too. The word's tokens have moved since n0 was taken,
                # and a row counting more of them under k than n0_k does would make _word_draw's thinning
                # probability exceed 1 (it needs snap_k <= n0_k, true at the start of a run).
                n0[:] = n_k
                B = _beta_table(n0, beta, vbeta, bufs)
            m, S = _word_table(n_wk[w], n0, vbeta, bufs)
            j, rng = _alias_run((j, b, w, (m, S, B)), tokens, lists, table, prior, prop, work, rng)
    return rng


@njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "arcp", "contract", "afn"}, error_model="numpy")
def _sweep_word(tokens: Tokens, n_dk: np.ndarray, table: Table, prior: Prior, w_lo: int, w_hi: int, rng: np.uint64,
                carry: tuple) -> np.uint64:
    """Words w_lo..w_hi-1 of a sweep whose proposal is exact over the word's topics; an MH test corrects the rest.

    p(k) = (n_dk + a)(n_wk + b) / (n_k + V b) is proposed from q(k) = (n_dk + a)(n_wk / (n_k + V b) + b c), c the
    mean of 1 / (n_k + V b): its first part is over the topics with n_wk > 0 (a list kept for the word's run), fresh,
    built per token; the second is a doc proposal (another token's topic, or a uniform one) with no table.
    ``carry`` = (each word's topics with n_wk > 0 (V x K), their number + 1 per word (0: not listed yet), the slots of
    a word's topics (-1 if absent), a cdf, 1 / (n_k + V b), the MH steps per token, each listed topic's n_wk / (n_k +
    V b)). The lists persist from call to call: whoever changes n_wk outside the kernel zeroes the word's count.
    """
    word_ptr, doc, z, order, offsets, z_doc = tokens
    (n_wk, n_k), (alpha, beta) = table, prior
    lists, listed, wpos, cdf, inv, n_steps, coef = carry
    V, K = n_wk.shape
    vbeta = V * beta
    n = 0.0
    for k in range(K):
        inv[k] = 1.0 / (n_k[k] + vbeta)
        n += n_k[k]
    bc = beta * K / (n + K * vbeta)  # b c: topics' weight outside the word's topics, per unit of n_dk + a
    for w in range(w_lo, w_hi):
        a, b = word_ptr[w], word_ptr[w + 1]
        if a == b:
            continue
        row, wt = n_wk[w], lists[w]
        # NOTE: the word's topics are kept from sweep to sweep, not found by a pass over its K counts each time: with
        # 2 workers each passed over the rows of nearly every word (KJV, K = 1,000: 5.2 M counts a sweep), a cost
        # one worker pays once and two pay twice.
        m = listed[w] - 1
        if m < 0:
            m = 0
            for k in range(K):
                if row[k] > 0:
                    wt[m] = k
                    m += 1
        for i in range(m):
            k = wt[i]
            wpos[k] = i
            coef[i] = row[k] * inv[k]
        for j in range(a, b):
            d, s, p, lo = doc[j], z[j], order[j], offsets[doc[j]]
            n_dk[d, s] -= 1
            row[s] -= 1
            n_k[s] -= 1
            inv[s] = 1.0 / (n_k[s] + vbeta)
            if row[s] == 0:  # s leaves the word's topics: the last one moves into its slot
                m -= 1
                i, last = wpos[s], wt[m]
                wt[i], wpos[last], wpos[s], coef[i] = last, i, -1, coef[m]
            else:
                coef[wpos[s]] = row[s] * inv[s]
            A = 0.0  # the exact part's mass, over the word's topics
            # NOTE: n_wk / (n_k + V b) kept per listed topic (only the moved topics' change): 14-16% less CPU than
            # the product read here (KJV, K = 1,000, 30 sweeps, two paired runs: 1.82-1.86 against 2.11-2.20 s).
            for i in range(m):
                A += coef[i] * (n_dk[d, wt[i]] + alpha)
                cdf[i] = A
            n_other = offsets[d + 1] - lo - 1  # the other tokens of document d
            ps = (n_dk[d, s] + alpha) * (row[s] + beta) * inv[s]
            qs = (n_dk[d, s] + alpha) * (row[s] * inv[s] + bc)
            for _ in range(n_steps):
                rng, u = _uniform(rng)
                x = u * (A + bc * (n_other + K * alpha))
                if x < A:
                    t = wt[min(np.searchsorted(cdf[:m], x, side="right"), m - 1)]
                else:
                    t = _doc_topic((x - A) / bc, n_other, lo, p, z_doc, alpha, K)
                if t != s:
                    pt = (n_dk[d, t] + alpha) * (row[t] + beta) * inv[t]
                    qt = (n_dk[d, t] + alpha) * (row[t] * inv[t] + bc)
                    rng, u = _uniform(rng)
                    if u * ps * qt < pt * qs:  # accept with min(1, p(t) q(s) / (p(s) q(t)))
                        s, ps, qs = t, pt, qt
            z[j] = s
            z_doc[p] = s
            n_dk[d, s] += 1
            if row[s] == 0:
                wt[m], wpos[s] = s, m
                m += 1
            row[s] += 1
            n_k[s] += 1
            inv[s] = 1.0 / (n_k[s] + vbeta)
            coef[wpos[s]] = row[s] * inv[s]
        listed[w] = m + 1
        for i in range(m):
            wpos[wt[i]] = -1
    return rng


def _list_dtype(K: int) -> np.dtype:
    """The type of the word kernel's lists of topics: int16 where K topics fit."""
    return np.dtype(np.int16 if K <= np.iinfo(np.int16).max else np.int32)


def _word_carry(V: int, K: int) -> tuple:
    """The word kernel's lists of V words' topics (none listed yet) and work arrays (slots -1), its MH steps per
    token."""
    return (np.empty((V, K), _list_dtype(K)), np.zeros(V, np.int32), np.full(K, -1, np.int32), np.empty(K),
            np.empty(K), _WORD_STEPS, np.empty(K))


@njit(cache=True, nogil=True, error_model="numpy")
def _word_token_chain(tokens: Tokens, n_dk: np.ndarray, table: Table, prior: Prior, w: int, n_draws: int, carry: tuple,
                      rng: np.uint64) -> np.ndarray:
    """Resample the one token of ``tokens`` (word w) n_draws times by the word kernel; how often it took each topic."""
    seen = np.zeros(table[1].shape[0], np.int64)
    for _ in range(n_draws):
        rng = _sweep_word(tokens, n_dk, table, prior, w, w + 1, rng, carry)
        seen[tokens[2][0]] += 1
    return seen


@njit(cache=True, nogil=True, error_model="numpy")
def _token_chain(token: Run, docs: tuple, table: Table, prior: Prior, stale: tuple, n_draws: int, sampler: tuple,
                 rng: np.uint64) -> np.ndarray:
    """Resample the token at corpus position p n_draws times, the others fixed; the count of each topic it took.

    ``token`` = (p, its document d, its word w); ``docs`` = (offsets, z_doc, n_dk, d's topic lists).
    ``sampler`` = (alias, steps): one draw is one token's step of the mh kernel (n_dk, z_doc) or, with ``alias``,
    of the alias kernel (the topic lists), each of ``steps`` proposal cycles. ``stale`` = (tab_wk, tab_k, s_tab,
    rebuild): the tables are built from (tab_wk, tab_k), which count the token under s_tab, before the first draw;
    with ``rebuild`` they are views of the counts (n_wk's row of w, n_k) and the tables are rebuilt before every
    draw, from the counts with the token in (as a sweep does).
    """
    (p, d, w), (offsets, z_doc, n_dk, lists), (n_wk, n_k), (alias, steps) = token, docs, table, sampler
    tab_wk, tab_k, s_tab, rebuild = stale
    V, K = n_wk.shape
    vbeta = V * prior[1]
    bufs = _table_buffers(n_wk)
    n0 = np.empty_like(tab_k)
    z = np.full(1, z_doc[p], np.int32)
    tokens = (np.zeros(2, np.int64), np.full(1, d, np.int64), z, np.full(1, p, np.int64), offsets, z_doc)
    seen = np.zeros(K, np.int64)
    prop = (bufs, n0, -1 if rebuild else s_tab, steps)
    work = (np.empty(K), np.empty(K), np.empty(K))  # the alias kernel's scratch; [1] = 1 / (n_k + V beta) per draw
    for i in range(n_draws):
        if rebuild or i == 0:
            n0[:] = tab_k
            B = _beta_table(n0, prior[1], vbeta, bufs)
            m, S = _word_table(tab_wk, n0, vbeta, bufs)
        if alias:
            work[1][:] = 1.0 / (n_k + vbeta)
            _, rng = _alias_run((0, 1, w, (m, S, B)), tokens, lists, table, prior, prop, work, rng)
            z_doc[p] = z[0]
        else:
            rng = _mh_run((0, 1, w, (m, S, B)), tokens, n_dk, table, prior, prop, rng)
        seen[z[0]] += 1
    return seen


def _doc_lists(n_dk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per document, the topics with n_dk > 0, their counts, the list length, and each topic's slot (-1 if absent);
    int16 where K and the longest document fit."""
    # NOTE: a token's document is a random one in word-major order, and its list rows are read from L2 or L3: in
    # int16, the three D x K tables of the KJV at K = 100 are 0.7 MB, not 1.4. With the sparse kernel's doc part
    # summed without a cdf: 85 against 97 ns of CPU per token at K = 100, 446 against 512 at K = 1,000 (sweeps 1-15
    # from a random start, medians of 8 and 4 paired runs on a busy machine); alias 417 against 481 at K = 1,000.
    D, K = n_dk.shape
    t = np.int16 if max(K, n_dk.sum(1).max(initial=0)) < 2**15 else np.int32
    lists = np.zeros((D, K), t), np.zeros((D, K), t), np.zeros(D, np.int32), np.full((D, K), -1, t)
    _fill_lists(n_dk, *lists)
    return lists


@njit(cache=True, nogil=True, error_model="numpy")
def _fill_lists(n_dk: np.ndarray, idx: np.ndarray, cnt: np.ndarray, length: np.ndarray, pos: np.ndarray) -> None:
    """The lists of :func:`_doc_lists`, written into empty ones."""
    D, K = n_dk.shape
    for d in range(D):
        for k in range(K):
            if n_dk[d, k] > 0:
                idx[d, length[d]] = k
                cnt[d, length[d]] = n_dk[d, k]
                pos[d, k] = length[d]
                length[d] += 1


@njit(cache=True, nogil=True, error_model="numpy")
def _lists_to_dense(idx: np.ndarray, cnt: np.ndarray, length: np.ndarray, n_dk: np.ndarray) -> None:
    """Write the per-document topic lists back into the dense table n_dk."""
    n_dk[:] = 0
    for d in range(n_dk.shape[0]):
        for i in range(length[d]):
            n_dk[d, idx[d, i]] = cnt[d, i]


class GibbsState:
    """A corpus (or a worker's shard), its topic assignments and the three count tables, ready to sweep.

    Tokens are kept in word-major order (``order`` maps that order to corpus positions), so a
    sweep reads each token's document and topic sequentially. ``n_wk`` and ``n_k`` may be a
    worker's cached copy of the shared table: the sweep reads and updates whatever arrays are
    here, which is exactly AD-LDA's local sampling step.
    """

    def __init__(self, corpus: LDACorpus, n_topics: int, alpha: float, beta: float, z: np.ndarray,
                 counts: tuple[np.ndarray, np.ndarray] | None = None, kernel: str = "sparse",
                 mh_steps: int = MH_STEPS) -> None:
        """Take assignments z (corpus order); ``counts`` = (n_wk, n_k), the word-topic table and its column sums,
        defaults to the counts of z (pass a worker's copy of the table to share it).

        ``mh_steps``: the mh kernel's word-then-doc cycles per token (LightLDA's MH steps; ignored by the others)."""
        check_prior(kernel, n_topics, alpha, beta, mh_steps)
        self.corpus, self.n_topics, self.alpha, self.beta, self.kernel = corpus, n_topics, float(alpha), float(beta), kernel
        self.n_dk = doc_topic_counts(corpus, z, n_topics)
        if kernel in ("mh", "dense", "word") and np.diff(corpus.offsets).max(initial=0) < 2**15:
            # NOTE: the sweeps that read n_dk read it as int16 where the longest document fits: a token's document is
            # a random one in word-major order, and half the bytes per row is half the lines its topics touch (word
            # kernel, KJV, K = 1,000, 30 sweeps: 1.13-1.14x less CPU, the same chain).
            self.n_dk = self.n_dk.astype(np.int16)
        # a worker's copy of the table is used as given: its own V x K counts would be built only to be dropped
        self.n_wk, self.n_k = word_counts(corpus.words, z, corpus.n_words, n_topics) if counts is None else counts
        self.order = np.argsort(corpus.words, kind="stable").astype(np.int64)
        self.word_ptr = np.concatenate([[0], np.cumsum(np.bincount(corpus.words, minlength=corpus.n_words))])
        self.doc_wm = corpus.doc_of[self.order]
        self.z_wm = np.asarray(z, dtype=np.int32)[self.order]
        if kernel in ("sparse", "alias"):  # D x K lists: the other kernels read n_dk itself
            self.dk_idx, self.dk_cnt, self.dk_len, self.dk_pos = _doc_lists(self.n_dk)
        # the word kernel's work arrays, made once: a block of the in-place path is a call, ~70 a sweep at K = 1,000
        self._carry = _word_carry(corpus.n_words, n_topics) if kernel == "word" else None
        self._z_doc = np.empty_like(self.z_wm)  # the mh and word kernels' topics in corpus order (each sweep)
        self.mh_steps = int(mh_steps)

    @classmethod
    def init(cls, corpus: LDACorpus, n_topics: int, alpha: float = 0.1, beta: float = 0.01, seed: int = 0,
             kernel: str = "sparse", mh_steps: int = MH_STEPS) -> "GibbsState":
        """Random initial topics and the counts that go with them (the constructor checks the hyperparameters)."""
        return cls(corpus, n_topics, alpha, beta, random_assignments(corpus, n_topics, seed), kernel=kernel,
                   mh_steps=mh_steps)

    @property
    def z(self) -> np.ndarray:
        """Topic of every token, in corpus order."""
        z = np.empty_like(self.z_wm)
        z[self.order] = self.z_wm
        return z

    def sweep(self, seed: int = 0) -> None:
        """Resample every token once (in place); n_dk, n_wk, n_k stay in step with the assignments."""
        self.begin_sweep()
        self.sweep_words(0, self.corpus.n_words, _rng_state(seed))
        self.end_sweep()

    def counts_changed(self, lists: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """n_wk was changed or replaced from outside the sweeps: the word kernel lists each word's topics again.

        ``lists`` = (V x K topics, V counts), the lists to keep instead of the state's own: those of the workers that
        sample on the same n_wk (shared memory), each word's changed only by the worker holding the word."""
        if self._carry is None:
            return
        if lists is None:
            self._carry[1][:] = 0
        else:
            self._carry = (*lists, *self._carry[2:])

    def begin_sweep(self) -> None:
        """Before a sweep's first :meth:`sweep_words`: the mh and word kernels' topics in document order."""
        if self.kernel in ("mh", "word"):
            self._z_doc[self.order] = self.z_wm

    def sweep_words(self, w_lo: int, w_hi: int, rng: np.uint64) -> np.uint64:
        """Resample the tokens of words w_lo..w_hi-1 once, drawing from the xorshift state ``rng``; the state after.

        The mh and alias kernels build their stale tables with the topic totals n_k of this call's start. The words
        go to the kernel in blocks of about BLOCK tokens (whole words), the same chain as one call."""
        tokens, table, prior = (self.word_ptr, self.doc_wm, self.z_wm), (self.n_wk, self.n_k), (self.alpha, self.beta)
        kernel = self.kernel
        docs = (self.dk_idx, self.dk_cnt, self.dk_len, self.dk_pos) if kernel in ("sparse", "alias") else self.n_dk
        carry = self._carry  # the word kernel's work arrays; sparse and dense carry nothing
        if kernel in ("mh", "alias"):
            # the stale tables' state, carried from block to block as one call carried it from word to word
            carry = (_table_buffers(self.n_wk), self.n_k.copy(), -1, self.mh_steps if kernel == "mh" else _ALIAS_STEPS)
        if kernel in ("mh", "word"):
            tokens += (self.order, self.corpus.offsets, self._z_doc)
        sweep = {"sparse": _sweep_sparse, "dense": _sweep_dense, "mh": _sweep_mh, "alias": _sweep_alias,
                 "word": _sweep_word}[kernel]
        # a block of mh costs its cycles per token: as many tokens as cost what BLOCK tokens cost at MH_STEPS
        bounds = blocks(self.word_ptr, w_lo, w_hi, BLOCK * MH_STEPS // self.mh_steps if kernel == "mh" else BLOCK)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            # numba hands a uint64 back as a Python int, which it would then read as int64
            rng = np.uint64(sweep(tokens, docs, table, prior, lo, hi, rng, carry))
        return rng

    def end_sweep(self) -> None:
        """After a sweep's last :meth:`sweep_words`: n_dk from the sparse and alias kernels' topic lists."""
        if self.kernel in ("sparse", "alias"):
            _lists_to_dense(self.dk_idx, self.dk_cnt, self.dk_len, self.n_dk)

    def memory(self) -> dict[str, int]:
        """Bytes held, by structure: the word-topic counts (V x K and K), the document-topic counts (D x K),
        the per-document topic lists of the sparse and alias kernels (3 D x K) or the word kernel's per-word lists
        (V x K), the per-token arrays."""
        out = {"n_wk, n_k": self.n_wk.nbytes + self.n_k.nbytes, "n_dk": self.n_dk.nbytes}
        if self.kernel in ("sparse", "alias"):
            out["topic lists"] = sum(a.nbytes for a in (self.dk_idx, self.dk_cnt, self.dk_pos, self.dk_len))
        if self.kernel == "word":
            out["topic lists"] = self._carry[0].nbytes + self._carry[1].nbytes
        out["per token"] = sum(a.nbytes for a in (self.order, self.word_ptr, self.doc_wm, self.z_wm, self._z_doc))
        return out

    def log_likelihood(self) -> float:
        """log p(w, z) of the current state (valid when n_wk, n_k are this corpus's own counts)."""
        return log_likelihood(self.n_dk, self.n_wk, self.n_k, self.alpha, self.beta)

    def check_counts(self) -> None:
        """Raise AssertionError unless the tables equal those recomputed from z (single-process use)."""
        counted = count_tables(self.corpus, self.z, self.n_topics)
        for name, mine, expected in zip(("n_dk", "n_wk", "n_k"), (self.n_dk, self.n_wk, self.n_k), counted):
            assert np.array_equal(expected, mine), f"{name} differs from the counts of z"
        if self._carry is not None:
            check_word_lists(*self._carry[:2], self.n_wk)


def check_word_lists(lists: np.ndarray, listed: np.ndarray, n_wk: np.ndarray) -> None:
    """Raise AssertionError unless every listed word's list (the word kernel's) holds exactly its topics with
    n_wk > 0, each once."""
    for w in np.flatnonzero(listed):
        mine = lists[w, :listed[w] - 1]
        assert sorted(mine.tolist()) == np.flatnonzero(n_wk[w]).tolist(), f"word {w}'s list is not its topics"


def mh_token_draws(state: GibbsState, position: int, n_draws: int, seed: int = 0,
                   table: tuple[np.ndarray, np.ndarray, int] | None = None) -> np.ndarray:
    """Resample one token ``n_draws`` times by an MH kernel, every other token fixed; how often it took each topic.

    The kernel is AliasLDA's for a state with ``kernel="alias"``, the word kernel's for ``kernel="word"`` (fresh
    counts: it takes no ``table``), LightLDA's (``mh``) for any other.
    Its long-run frequencies must be the exact conditional p(k | rest) (``simlib.problems.lda.conditional``).
    By default the tables are rebuilt before each draw from the counts with the token in, as a
    sweep does; ``table = (n_wk row of its word, n_k, the topic they count it under)`` fixes stale
    ones instead. The state's counts and the token's topic are left as the last draw put them.
    """
    c = state.corpus
    check.positive_int("n_draws", n_draws)
    if not 0 <= position < c.n_tokens:
        raise ValueError(f"position must lie in [0, {c.n_tokens}), got {position!r}")
    d, w = int(c.doc_of[position]), int(c.words[position])
    z_doc = state.z
    K = state.n_topics
    tab_wk, tab_k, s_tab = table if table is not None else (state.n_wk[w], state.n_k, int(z_doc[position]))
    if not (0 <= s_tab < K and tab_wk[s_tab] >= 1 and tab_k[s_tab] >= 1):
        raise ValueError(f"table: its counts must hold the token under its topic s_tab = {s_tab!r} (>= 1 there)")
    if state.kernel == "word":  # fresh counts, no stale table: the kernel's sweep over a word holding this one token
        if table is not None:
            raise ValueError("table: the word kernel builds no stale table (its proposal reads the counts as they are)")
        word_ptr = np.zeros(c.n_words + 1, np.int64)
        word_ptr[w + 1:] = 1
        one = (np.full(1, d, np.int64), np.full(1, z_doc[position], np.int32), np.full(1, position, np.int64))
        tokens = (word_ptr, *one, c.offsets, z_doc)
        seen = _word_token_chain(tokens, state.n_dk, (state.n_wk, state.n_k), (state.alpha, state.beta), w, n_draws,
                                 _word_carry(c.n_words, K), _rng_state(seed))
        state.z_wm[:] = z_doc[state.order]
        return seen
    alias = state.kernel == "alias"
    # The alias chain keeps d's topic list; the mh chain keeps n_dk and reads no list (empty ones stand in).
    lists = (state.dk_idx, state.dk_cnt, state.dk_len, state.dk_pos) if alias else _doc_lists(state.n_dk[:0])
    stale = (np.asarray(tab_wk, state.n_wk.dtype).reshape(K), np.asarray(tab_k, state.n_k.dtype).reshape(K), int(s_tab),
             table is None)
    seen = _token_chain((position, d, w), (c.offsets, z_doc, state.n_dk, lists), (state.n_wk, state.n_k),
                        (state.alpha, state.beta), stale, n_draws, (alias, _ALIAS_STEPS if alias else state.mh_steps),
                        _rng_state(seed))
    state.z_wm[:] = z_doc[state.order]
    if alias:
        _lists_to_dense(state.dk_idx, state.dk_cnt, state.dk_len, state.n_dk)
    elif state.kernel == "sparse":
        state.dk_idx, state.dk_cnt, state.dk_len, state.dk_pos = _doc_lists(state.n_dk)
    return seen


def cpu_per_token(corpus: LDACorpus, n_topics: int, kernel: str = "sparse", n_sweeps: int = 3, alpha: float = 0.1,
                  beta: float = 0.01, seed: int = 0) -> tuple[float, GibbsState]:
    """CPU seconds per token of sweeps 1..n_sweeps from a random start (sweep 0 compiles: not timed); and the state.

    CPU time of this process (``time.process_time``), so other programs on a busy machine inflate
    it far less than wall time. Sweep s is seeded by s, as in a loop of ``state.sweep(seed=s)``.
    """
    check_corpus(corpus)
    check.positive_int("n_sweeps", n_sweeps)
    state = GibbsState.init(corpus, n_topics, alpha, beta, seed, kernel)
    state.sweep(seed=0)
    t = time.process_time()
    for s in range(1, n_sweeps + 1):
        state.sweep(seed=s)
    return (time.process_time() - t) / (n_sweeps * corpus.n_tokens), state


def fit(corpus: LDACorpus, n_topics: int, alpha: float = 0.1, beta: float = 0.01, n_sweeps: int = 100,
        seed: int = 0, kernel: str = "sparse", record_every: int = 1) -> tuple[GibbsState, list[float]]:
    """Run ``n_sweeps`` Gibbs sweeps from a random start; return the state and log p(w, z) after each recorded sweep."""
    check_corpus(corpus)
    check.positive_int("n_sweeps", n_sweeps)
    check.positive_int("record_every", record_every)
    state = GibbsState.init(corpus, n_topics, alpha, beta, seed, kernel)
    lls = []
    for s in range(n_sweeps):
        state.sweep(seed=seed * 1_000_003 + s)
        if (s + 1) % record_every == 0:
            lls.append(state.log_likelihood())
    return state, lls


__all__ = ["GibbsState", "fit", "cpu_per_token", "mh_token_draws", "check_prior", "check_word_lists", "KERNELS",
           "MIN_MH_PRIOR", "MH_STEPS"]

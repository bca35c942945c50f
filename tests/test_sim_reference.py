"""The simulator's traces, bit for bit, against digests recorded from the engine before it was made faster.

Each digest is a SHA-256 over every field of every span, update and quality point (floats by their exact
hex form), recorded at 46d257c (main before issue 28's speed work) with ``python tests/test_sim_reference.py``.
An optimisation that changes any event's order, any float's last bit or any record fails here by name.
"""
from __future__ import annotations

import hashlib

import pytest

from simlib.problems.logistic import LogisticProblem, make_sparse_classification
from simlib.sim import SimConfig, Stragglers
from simlib.sim.engine import run_config

JITTER = Stragglers(jitter="lognormal", jitter_sigma=0.5)

# name -> (SimConfig fields, digest recorded at 46d257c)
CASES: dict[str, tuple[dict, str]] = {
    "bsp": (dict(n_workers=8, steps=30, stragglers=JITTER), "8d03f1b0efa5cab7286772375039e61f78a8d8b385f1d0c7ac25f997797b67ec"),
    "ssp3": (dict(n_workers=8, steps=30, protocol="ssp:3", stragglers=Stragglers(jitter="lognormal", slow_workers=2)),
             "da8ef7a42655546520f69c03a312531c4899a46d3c431019a1a1d551eed01c25"),
    "async": (dict(n_workers=8, steps=30, protocol="async", stragglers=Stragglers(jitter="exponential")), "3beec99f43a323fcf8c0400fcae06b8e914c5722e1e2c19010ef7a0b6388e0dc"),
    "pauses_restart": (dict(n_workers=6, steps=25, protocol="ssp:2", stragglers=Stragglers(
        jitter="lognormal", pause_prob=0.1, pause_time=0.005, fail_worker=2, fail_time=0.004, restart_after=0.01)), "d918b3501cdb32bbecaf14b563cf9b3bcbcdaa1f3b22d1f9482a459b8713d5cb"),
    "failed_stalls": (dict(n_workers=5, steps=20, stragglers=Stragglers(fail_worker=1, fail_time=0.003)), "30d6d57aa9f188788b3303cc45c1601a7c44c806f1d2876687fc3768030e65dd"),
    "backup_bsp": (dict(n_workers=8, steps=30, backup_workers=2, stragglers=JITTER), "1650c89a0ef44faed7a8c11ba0822ad9d4a7577090a08b9c26fd2dea56696024"),
    "timeout_ssp": (dict(n_workers=8, steps=30, protocol="ssp:1", timeout=0.0006, stragglers=JITTER),
                    "f153d77830c5fb7315409425446203c2be2b89b77b51ea622c55a9c3049701b3"),
    "servers_bsp": (dict(n_workers=8, steps=20, n_servers=3, n_summation=1, server_time=1e-5, stragglers=JITTER), "887b00f2be20a756daff4919ae4214410e188eb07328d1935b674ae6feaca044"),
    "servers_async": (dict(n_workers=8, steps=20, protocol="async", n_servers=4, bandwidth=1e7, stragglers=JITTER),
                      "e67ca7637043167110afe898ad8a0321b68db447e0caa733ffe466d08a9e780f"),
    "sites_flat": (dict(n_workers=9, steps=15, protocol="ssp:2", sites=3, stragglers=JITTER), "fc412e12d6a7729018434ab16a0bcc6eb4a7d1e614f82331dd36cf2743baf53a"),
    "sites_per_site": (dict(n_workers=9, steps=15, protocol="ssp:1", sites=3, hierarchy="per-site",
                            significance=0.05, n_servers=2, stragglers=JITTER),
                       # re-recorded when site servers began summing a step's pushes before the WAN (a model change)
                       "3a70d41afd6a2abff7b7b32b73b2432b627e5e55f54fba452d8457043dce5d9b"),
    "essp": (dict(n_workers=6, steps=20, protocol="essp:2", n_servers=2, stragglers=JITTER), "4e5052d899b6fc2745a0ae82c95eff0a3a3bef95c163347b31e9eca420632f3e"),
    "ssp_cache": (dict(n_workers=6, steps=20, protocol="ssp:2", cache=True, stragglers=JITTER), "a1d62491b63020c608cf6cd12e1a5f973a9aa74d4172dfc580b4eda48a644a07"),
    "allreduce": (dict(n_workers=6, steps=15, topology="allreduce", stragglers=JITTER), "3524d84a8710fb08fab62848b52908840c69af2387c0c6d5dbae0f967654a6b9"),
    "topk_aware": (dict(n_workers=8, steps=20, protocol="ssp:2", compression="topk:0.1", staleness_aware=True,
                        stragglers=JITTER), "5c79a4c6c73e7041881918e728f85a137543755640451176e209a8c286019c74"),
    "accumulation": (dict(n_workers=4, steps=20, protocol="async", accumulation=8, cost_unit="sample"), "5792cf8c957dbb18722f658b9d6fd134c2e0a89454f1c9882ba025201b714b04"),
    "many_bsp": (dict(n_workers=200, steps=8, lr=0.05, eval_every=4, stragglers=JITTER), "a4c88eddb85f660256a87d8af523b528b75b6ef7b379f3b73e4d60407980e47a"),
    "many_ssp3": (dict(n_workers=200, steps=8, protocol="ssp:3", lr=0.05, eval_every=4, stragglers=JITTER), "ad11b8bb261d1319459198c784745b2a4103e37e680c41ef8f89b2683a8e66b0"),
    "many_async": (dict(n_workers=200, steps=8, protocol="async", lr=0.05, eval_every=4, n_servers=2,
                        stragglers=JITTER), "2b2b10cfc0d728fa1cd75edac9703536e1cb16549aae6be8933739796d236cac"),
}


def _problem() -> LogisticProblem:
    return LogisticProblem(make_sparse_classification(n_rows=2_000, n_features=500, nnz_per_row=10, seed=0),
                           l2=1e-4, eval_rows=1_000)


def _field(x: object) -> str:
    return x.hex() if isinstance(x, float) else repr(x)


def digest(trace) -> str:
    """SHA-256 of every span, update and quality point, each field exactly (floats as hex)."""
    h = hashlib.sha256()
    for name, rows in (("spans", trace.spans), ("updates", trace.updates), ("quality", trace.quality)):
        h.update(f"{name}:{len(rows)};".encode())
        for row in rows:
            h.update((",".join(_field(x) for x in row) + ";").encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def problem():
    return _problem()


@pytest.mark.parametrize("name", sorted(CASES))
def test_trace_matches_the_recorded_engine(name, problem):
    fields, expected = CASES[name]
    assert digest(run_config(SimConfig(**fields), problem).trace) == expected


if __name__ == "__main__":  # print the digests of the engine as it is now
    p = _problem()
    for name, (fields, _) in CASES.items():
        print(f"{name!r}: {digest(run_config(SimConfig(**fields), p).trace)!r}")

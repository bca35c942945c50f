"""What the all-reduce tests on every substrate share (tests/test_allreduce.py, and test_ray.py on its cluster):
the run's sizes, one process's parameters on the global batch, and a worker's send spans of a step."""
import numpy as np

STEPS, BATCH, LR, N = 4, 16, 0.2, 2


def one_process(prob, steps=STEPS, n=N):
    """One process on the global batch (every worker's mini-batch): theta -= n lr grad of the mean loss over it,
    which is the sum of the workers' -lr grad (an all-reduce sums, as BSP's pushes do)."""
    w = prob.init_params()
    for c in range(steps):
        rows = np.concatenate([prob.batch(s, c, BATCH) for s in prob.shards(n)])
        w = w - n * LR * prob.gradient(w, rows)
    return w


def sends(res, worker, step):
    return [s for s in res.trace.spans if s.kind == "send" and s.worker == worker and s.step == step]

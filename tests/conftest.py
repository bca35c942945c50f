"""Shared fixtures: small problems that build in milliseconds; the ``--heavy`` option."""
import pytest


def pytest_configure(config):
    # NOTE: started as a background job (`cmd &` in a script, nohup), the suite inherits SIGINT
    # ignored, and so does every process it starts: each Ctrl-C the tests send would be dropped and
    # those tests would hang or fail. Take SIGINT as a terminal's foreground program gets it.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true", help="also run the tests marked heavy (many minutes)")


# The longest files first (seconds in one process, quiet: Ray 176, notebooks 169, grading 155, faults 57), so that
# with the suite on two processes (pyproject's -n 2 --dist loadfile --no-loadscope-reorder) no long file starts last
# and runs alone at the end.
LONGEST_FIRST = ["test_ray.py", "test_notebooks.py", "test_grade.py", "test_faults.py", "test_browser_layout.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept
    if config.getoption("--heavy"):
        return
    skip = pytest.mark.skip(reason="heavy (many minutes): run with pytest --heavy")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)

from simlib.problems.logistic import LogisticProblem, make_sparse_classification


@pytest.fixture(scope="session")
def small_data():
    """A 2,000 x 500 sparse classification problem (deterministic)."""
    return make_sparse_classification(n_rows=2_000, n_features=500, nnz_per_row=10, seed=0)


@pytest.fixture(scope="session")
def small_problem(small_data):
    """Logistic regression on ``small_data``."""
    return LogisticProblem(small_data, l2=1e-4, eval_rows=1_000)


@pytest.fixture
def sigkill_a_worker():
    """A context manager: SIGKILL the first worker process that appears, ``delay`` s after it starts.

    It yields a list that receives the kill's ``time.monotonic()``, so a test can time the reaction.
    """
    import contextlib
    import multiprocessing
    import os
    import signal
    import threading
    import time

    @contextlib.contextmanager
    def killer(delay: float = 0.3, within: float = 120.0):  # within: a bound for a worker that never starts
        killed_at: list[float] = []

        def run() -> None:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                children = multiprocessing.active_children()
                if children:
                    time.sleep(delay)
                    os.kill(children[0].pid, signal.SIGKILL)
                    killed_at.append(time.monotonic())
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield killed_at
        finally:
            thread.join()

    return killer


@pytest.fixture(scope="session")
def cooc():
    """GloVe co-occurrences of the first 60 KJV chapters (window 5, words seen at least 3 times)."""
    from simlib.data import Vocabulary, load_kjv
    from simlib.problems.glove import count_cooccurrences

    docs = load_kjv().docs[:60]
    vocab = Vocabulary.build(docs, min_count=3)
    ids, offsets = vocab.encode_docs(docs)
    return count_cooccurrences(ids, offsets, len(vocab), window=5)


@pytest.fixture(scope="module")
def tiny_problem():
    """A 400 x 200 logistic problem for the live panel; stops the panel's process pool afterwards."""
    from simlib.app.scenario import shutdown_pool

    data = make_sparse_classification(n_rows=400, n_features=200, nnz_per_row=8, seed=1)
    yield LogisticProblem(data, l2=1e-4, eval_rows=200)
    shutdown_pool()

"""What the lessons call beside :func:`simlib.run`: their checks, ready-made experiments and small models.

* :mod:`~simlib.course.checks` -- each headline claim asserted where a lesson makes it, and quick mode.
* :mod:`~simlib.course.experiments` -- the default straggler cluster and a protocol comparison on it
  (also the CLI's ``compare``).
* :mod:`~simlib.course.delayed` -- delayed SGD, the analysed model behind the SSP bound.
* :mod:`~simlib.course.cache` -- a worker-side parameter cache: pulls saved against stale reads.
* :mod:`~simlib.course.averaging` -- model averaging.
* :mod:`~simlib.course.glove_twin`, :mod:`~simlib.course.shotgun_twin` -- GloVe's and Shotgun's speed-ups
  priced on the simulator before they are measured.

They sit above the substrates (they may run any of them) and below the app and the CLI.
"""

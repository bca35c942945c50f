"""The lecture app, above the simulator and the plots: the live panel and its server.

:mod:`simlib.app.scenario` maps the panel's controls onto simulator configs and runs them,
:mod:`simlib.app.live` is the ipywidgets panel, :mod:`simlib.app.serve` is ``python -m simlib live``.
"""

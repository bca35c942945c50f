"""Calibration and model validation, above the substrates: measure this machine, predict real runs, compare.

:mod:`simlib.calibration.calibrate` times the real substrates' pieces (pipe round trips, kernel
rates, process start) and fits the simulator's cost model to them; :mod:`simlib.calibration.validate`
runs the calibrated simulator and the real runs side by side and reports the prediction error.
Both import the substrates they measure; no substrate imports them.
"""

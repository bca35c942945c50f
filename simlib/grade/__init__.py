"""Autograding for the course's assignments: nbgrader markup, a sandboxed runner, a gradebook.

* :mod:`simlib.grade.notebook` -- the markup (solution and hidden-test blocks, nbgrader cell
  metadata), the student versions generated from ``solutions/``, the graded parts of a notebook.
* :mod:`simlib.grade.sandbox` -- one submission's cells run in a child process with time, memory
  and process limits, a filesystem it cannot read outside, and no network.
* :mod:`simlib.grade.probe` -- hidden checks outside the student's interpreter: calls on inputs drawn
  per grading, answered with plain values, compared with the master's by the grader.
* :mod:`simlib.grade.gradebook` -- grading a class: cache, gradebook CSV, per-student feedback.
* :mod:`simlib.grade.export` -- the files an instructor opens: long and wide gradebooks, the
  hand-grading sheet (export, fill, merge), notes.

The command line is ``python -m simlib.grade`` (see :mod:`simlib.grade.__main__`).
"""
from simlib.grade.notebook import generate_all, student_version

__all__ = ["generate_all", "student_version"]

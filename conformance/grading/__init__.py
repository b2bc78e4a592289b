"""Grading a class of "implement multi-head attention" submissions against a rubric.

``attention-conformance grade SUBMISSIONS --rubric RUBRIC.toml`` (see ``docs/grading.md``).
A class flows through four inner layers once, each importing only those after it here:

- :mod:`~conformance.grading.report`: each student's record, feedback and the class report,
  and the files written;
- :mod:`~conformance.grading.run`: one staged submission's classes found and checked in the
  sandboxed worker, results stored for resuming;
- :mod:`~conformance.grading.intake`: the submissions found, unpacked, converted and staged,
  and the roster;
- :mod:`~conformance.grading.score`: the rubric, a run's outcome and the points (a pure
  function).

Above them, the glue: :mod:`~conformance.grading.pipeline` (a class, from download to
outputs), :mod:`~conformance.grading.shards` and :mod:`~conformance.grading.merge` (a class on N
machines), :mod:`~conformance.grading.selftest` (the rubric against the assignment's own broken
variants), :mod:`~conformance.grading.gradescope` (one submission on Gradescope) and
:mod:`~conformance.grading.progress`; the command is :mod:`~conformance.frontends.grade`.
"""

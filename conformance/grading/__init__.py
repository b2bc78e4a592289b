"""Grading a class of "implement multi-head attention" submissions against a rubric.

``attention-conformance grade SUBMISSIONS --rubric RUBRIC.toml`` (see ``docs/grading.md``).
One idea per module, in the order data flows:

- :mod:`~conformance.grading.rubric`: the rubric (TOML), validated;
- :mod:`~conformance.grading.discovery`: one submission per student in an LMS download;
- :mod:`~conformance.grading.archives`, :mod:`~conformance.grading.notebooks`,
  :mod:`~conformance.grading.staging`: each student's files in one directory, hashed;
- :mod:`~conformance.grading.targets`: the rubric's classes found by reading the source;
- :mod:`~conformance.grading.execution`: running the checks (the sandboxed worker; a temporary
  trusted path for tests and self-test only) into a :mod:`~conformance.grading.outcome`;
- :mod:`~conformance.grading.scoring`: points from results, a pure function;
- :mod:`~conformance.grading.store`: per-student results on disk (resume, reruns);
- :mod:`~conformance.grading.outputs`, :mod:`~conformance.grading.feedback`,
  :mod:`~conformance.grading.class_report`: what comes out;
- :mod:`~conformance.grading.pipeline`, :mod:`~conformance.grading.selftest`,
  :mod:`~conformance.grading.gradescope`, :mod:`~conformance.frontends.grade`: the glue.
"""

"""What a class is graded by and what it earned: the rubric (``rubric``, read from TOML by
``rubric_file``), what running a submission gave (``outcome``) and the points (``scoring``, a
pure function). The bottom of grading: imports nothing else of it."""

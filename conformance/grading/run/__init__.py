"""Running one staged submission: the rubric's classes found by reading the source
(``targets``), their interface (``interface``), the checks run in the sandboxed worker
(``execution``), results kept per student for resuming (``store``), and the assignment's own
broken variants for the self-test (``variants``)."""

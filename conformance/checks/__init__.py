"""The checks: one module per invariant (``invariants/``), what they measure with (probes of the
attention matrix, effective precision), how they name a known bug (diagnosis, mask mistakes), and
the catalogue, the checks in report order, as data.

Nothing here runs a check: :mod:`conformance.run` does.
"""

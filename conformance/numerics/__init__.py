"""The numbers the verdicts are judged by: the float64 reference, the tolerances, the relative
position encodings the reference applies, and the platform's own kernel defects.

Imports only :mod:`conformance.model`.
"""

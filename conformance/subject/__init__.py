"""The boundary between the suite and an implementation: :class:`~conformance.subject.boundary.Subject`
and :class:`~conformance.subject.boundary.Instance` (all a check ever touches), the in-process
implementation of them, and what turns the suite's plain call data into an implementation's own
arguments (masks, positions, packed sequences, a KV cache).
"""

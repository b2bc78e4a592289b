"""The suite's vocabulary, as plain data: what an implementation declares (spec, weights,
declarations), the check names, expected results, verdicts and the status words they use.

The lowest layer: it imports nothing else of the suite. Every layer above may import it.
"""

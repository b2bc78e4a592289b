"""Running the catalogue: :class:`~conformance.run.runner.Runner` (the gate, then each check, into
verdicts), several implementations at a time, isolated ones in worker processes.
"""

"""``python -m conformance`` is the ``attention-conformance`` command."""

from conformance.frontends.entry import run

run()

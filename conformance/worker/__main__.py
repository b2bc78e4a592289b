"""``python -m conformance.worker``: the worker process (started by the checker, never by hand)."""

import sys

from conformance.worker.server import main

sys.exit(main())

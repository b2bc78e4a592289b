"""``python -m conformance`` is the ``attention-conformance`` command."""

import sys

from conformance.frontends.cli import main

sys.exit(main())

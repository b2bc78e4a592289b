"""``python -m conformance`` is the ``attention-conformance`` command."""

import sys

from conformance.cli import main

sys.exit(main())

"""``python -m conformance`` is the ``attention-conformance`` command."""

import sys

from conformance.frontends.entry import main

sys.exit(main())

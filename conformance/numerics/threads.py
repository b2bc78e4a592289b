"""torch's intra-op threads held at one while the suite calls implementations.

The suite calls implementations on tiny tensors, where threads cost more than they save, and on a
busy machine their synchronisation is ruinous: each waiting thread spins on a core that other
work needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one meanwhile, then restored (usable as a decorator).

    Measured beside other work on a 2-core machine: `check textbook reference-torch-mha` took
    36 to 72 s with torch's default two threads, 4.4 to 6.9 s with one (4.4 s both ways on an
    idle machine); inferring every bundled class took 63 to 65 s with two (40 to 47 s of CPU),
    17 s with one (7 s of CPU).
    """
    previous = torch.get_num_threads()
    if previous != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if previous != 1:
            torch.set_num_threads(previous)

"""The targets a worker loads: a file inside the submission (``dir/file.py::Attr``, relative, no
``..``) or a module (``package.module:Attr``); anything else is refused before a worker starts.
"""

from __future__ import annotations

import re

_FILE_SPEC = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[\w./-]+\.py::[A-Za-z_]\w*$")
_MODULE_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def check_spec(spec: str) -> None:
    """ValueError unless ``spec`` names a file inside the submission (``dir/file.py::Attr``) or a
    module (``package.module:Attr``)."""
    if not (_FILE_SPEC.match(spec) or _MODULE_SPEC.match(spec)):
        raise ValueError(f"{spec!r}: give path/file.py::Attr (relative, inside the submission) "
                         "or package.module:Attr")

"""The installed packages a checked file imports, read from its source (never run), for a warm
``serve``'s zygote to import ahead (``warm_start.preload``): every worker forked after has them,
so a module that imports transformers pays that import once, not at every check.

Standard library only. Only installed packages (in site-packages) are named, never the user's
own modules nor anything found from the working directory: what a zygote imports runs outside
any sandbox. (A cold ``check`` does not import ahead: measured on 2026-11-27 with the three
transformers-based wild styles, idle, its wall time did not change, 5.2-5.9 s either way; the
workers' own import of the package is not what a cold check waits for.)
"""

from __future__ import annotations

import ast
import importlib.util
import os
import site
import sysconfig
from pathlib import Path

from conformance.model.target_spec import TargetSpec


def _installed(name: str) -> bool:
    """Whether top-level module ``name`` is an installed package's (in site-packages: never the
    user's own code, nor anything found from the server's working directory)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    places = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    places.update(site.getsitepackages())
    return (spec is not None and spec.origin is not None
            and any(spec.origin.startswith(os.path.join(place, "")) for place in places))


def installed_imports(argv: list[str], cwd: str) -> list[str]:
    """The modules of installed packages the files a command names import (their source read,
    never run), for a zygote to import ahead."""
    names: list[str] = []
    for arg in argv[1:]:
        target = TargetSpec.parse(arg)
        file = target.location if target.file is not None else arg
        if arg.startswith("-") or not file.endswith(".py"):
            continue
        try:
            tree = ast.parse(Path(cwd, file).read_text())
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
    return [name for name in dict.fromkeys(names) if _installed(name.partition(".")[0])]

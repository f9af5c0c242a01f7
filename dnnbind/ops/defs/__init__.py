"""Layer ops: the library-backed operators, one module per operator (or family), each declaring its ``OpDef``
(ops/opdef.py) beside the library calls that run it. Every module in this folder is imported here, so adding an
operator is adding a module: nothing else lists it (nd registers whatever ``ops.opdef.DEFS`` holds).
"""

from __future__ import annotations

import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _m.startswith("_"):
        importlib.import_module(f"{__name__}.{_m}")

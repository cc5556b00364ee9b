"""Lazy package exports: `import inflight` (or `inflight.bench`) stays instant, and a name is
imported from the module that defines it the first time someone uses it."""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str], also: Sequence[str] = ()
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for `exports` (public name -> submodule defining it,
    relative to `package`); `also` names what the package defines itself."""
    names = sorted(exports) + list(also)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__

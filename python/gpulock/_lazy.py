"""Attributes of a package that are loaded from their module on first use (PEP 562), so that
importing the package stays fast for programs that never use them."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Tuple


def lazy_attributes(
    package: str, namespace: Dict[str, Any], homes: Dict[str, str]
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The ``__getattr__`` and ``__dir__`` for ``package``: ``homes`` maps each lazy name to the
    submodule that defines it; a submodule's own name loads the submodule. A loaded value is
    stored in ``namespace`` (the package's globals), so it is looked up once."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f".{home}", package)
        value = module if home == name else getattr(module, name)
        namespace[name] = value
        return value

    def dir_() -> List[str]:
        return sorted(set(namespace) | set(homes))

    return getattr_, dir_

"""``mx.name``: how symbol nodes made without a name are named (``NameManager``, ``Prefix``)."""

from ._graph import NameManager, Prefix, current_name_manager

__all__ = ["NameManager", "Prefix", "current_name_manager"]

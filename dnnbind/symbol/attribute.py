"""``mx.attribute``: ``AttrScope``, attributes given to every symbol node made inside it (``mx.AttrScope``)."""

from ._graph import AttrScope

__all__ = ["AttrScope"]

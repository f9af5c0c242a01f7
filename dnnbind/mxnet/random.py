"""``mxnet.random`` until ``dnnbind.nd.random`` exists. Layer: top (the MXNet alias); imports nothing.

The alias resolves ``mxnet.random`` to ``dnnbind.nd.random`` whenever that module can be imported (see
``_finder.TARGETS``); this stand-in is used only before it exists, and every use raises NotImplementedError
rather than seeding or sampling with a generator dnnbind's ops do not use.
"""

from __future__ import annotations

from ._unsupported import UnsupportedFeature


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise UnsupportedFeature(f"mxnet.random is not supported by dnnbind yet (mxnet.random.{name} was used): "
                              "it needs dnnbind.nd.random")

"""Where data sets live (MXNet's ``$MXNET_HOME/datasets/<name>``), and a note of where one was read from.

Layer: gluon: data; imports the standard library only.

MXNet 1.x keeps data sets in ``mx.base.data_dir()`` = ``$MXNET_HOME``, else ``~/.mxnet`` (``%APPDATA%\\mxnet`` on
Windows): ``MNIST()`` reads ``~/.mxnet/datasets/mnist``, ``FashionMNIST()`` ``.../fashion-mnist``, ``CIFAR10()``
``.../cifar10``. dnnbind reads the variable on each call (MXNet fixes the default ``root`` at import), so
setting ``os.environ["MXNET_HOME"]`` in a script works either way.
"""

from __future__ import annotations

import logging
import os
import platform

log = logging.getLogger("dnnbind.gluon.data")
_said: set[tuple[str, str]] = set()


def data_dir_default() -> str:
    """``~/.mxnet`` (``%APPDATA%\\mxnet`` on Windows), MXNet's ``mx.base.data_dir_default()``."""
    if platform.system() == "Windows":
        return os.path.join(os.environ.get("APPDATA", ""), "mxnet")
    return os.path.join(os.path.expanduser("~"), ".mxnet")


def data_dir() -> str:
    """``$MXNET_HOME`` if set, else ``data_dir_default()``: MXNet's ``mx.base.data_dir()``."""
    return os.getenv("MXNET_HOME", data_dir_default())


def dataset_dir(name: str) -> str:
    """``data_dir()/datasets/<name>``: the folder MXNet reads data set ``name`` from by default."""
    return os.path.join(data_dir(), "datasets", name)


def note_source(dataset: str, where: str, message: str) -> None:
    """Log ``message`` (where ``dataset`` came from) once per process and place, at WARNING level so that it
    shows without any logging set up (silence it with
    ``logging.getLogger("dnnbind.gluon.data").setLevel(logging.ERROR)``). Called only when the data did not come
    from where MXNet would have read it."""
    key = (dataset, where)
    if key not in _said:
        _said.add(key)
        log.warning("%s", message)

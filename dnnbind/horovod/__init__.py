"""dnnbind's stand-in for the ``horovod`` package: only ``horovod.mxnet`` (dnnbind/horovod/mxnet.py), over
dnnbind.distributed and NCCL. Layer: top; imports nothing at import time.

``dnnbind.install_mxnet_alias()`` (and ``python -m dnnbind.mxnet``) serves this package as ``horovod`` when no real
Horovod is installed, so ``import horovod.mxnet as hvd`` works in an MXNet program; a real Horovod always wins.
Without the alias: ``import dnnbind.horovod.mxnet as hvd``.
"""

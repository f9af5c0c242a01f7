"""``mxnet.gluon.data.sampler``: the samplers, under the module name MXNet gives them (code written for MXNet
subclasses ``gluon.data.sampler.Sampler``). Layer: gluon: data; they live in dataloader.py."""

from .dataloader import BatchSampler, DistributedSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["BatchSampler", "DistributedSampler", "RandomSampler", "Sampler", "SequentialSampler"]

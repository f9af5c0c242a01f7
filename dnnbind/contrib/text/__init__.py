"""MXNet 1.9.1's ``mx.contrib.text``: token counting (``utils``), the token index (``vocab.Vocabulary``) and token
embeddings (``embedding``: GloVe, FastText, CustomEmbedding, CompositeEmbedding), with MXNet's token order, indices
and vectors. Pre-trained files are read from disk only: dnnbind never downloads them (see ``embedding``)."""

from . import embedding, utils, vocab  # noqa: F401

__all__ = ["embedding", "utils", "vocab"]

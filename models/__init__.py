"""Model definitions (layer: models; imports dnnbind.gluon and dnnbind.nd only)."""

from .simple_cnn import SimpleCNN

__all__ = ["SimpleCNN"]

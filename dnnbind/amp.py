"""Loss scaling for float16 training, with MXNet's ``contrib.amp`` calls. Layer: gluon helpers; imports nothing of dnnbind
(the Trainer checks for overflow itself).

Mixed precision the MXNet 1.x way is ``net.cast('float16')`` (BatchNorm keeps float32) and a Trainer keeping
float32 master weights (``multi_precision=True``; see gluon.trainer). float16 gradients underflow where float32
ones would not (below 6e-8), so the loss is scaled up before backward and the gradients down before the update;
a step whose gradients overflowed (inf or NaN) is skipped and the scale halved, and after ``scale_window`` clean
steps it doubles again. The numbers are MXNet's (contrib/amp/loss_scaler.py): start at 2**16, factor 2, window
2000, at most 2**24::

    net.cast("float16")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "multi_precision": True})
    amp.init_trainer(trainer)
    with autograd.record():
        loss = loss_fn(net(x.astype("float16")), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(batch_size)      # unscales; skips the update when a gradient overflowed

MXNet's ``amp.init()`` (rewriting float32 operators to float16 ones as they run) is not provided: it raises,
naming this recipe. Through the ``mxnet`` alias this module is ``mxnet.contrib.amp``.
"""

from __future__ import annotations

from ._lib.errors import DnnbindValueError

import contextlib
import logging


__all__ = ["LossScaler", "init", "init_trainer", "scale_loss", "unscale"]

log = logging.getLogger(__name__)


class LossScaler:
    """Dynamic loss scale: ``loss_scale`` now; ``update_scale(overflow)`` after each step's check."""

    def __init__(self, init_scale: float = 2.0 ** 16, scale_factor: float = 2.0, scale_window: int = 2000,
                 max_scale: float = 2.0 ** 24):
        if not init_scale > 0 or not scale_factor > 1 or int(scale_window) < 1:
            raise DnnbindValueError(f"LossScaler: need init_scale > 0, scale_factor > 1 and scale_window >= 1, got "
                             f"{init_scale}, {scale_factor}, {scale_window}")
        self.loss_scale, self.scale_factor = float(init_scale), float(scale_factor)
        self.scale_window = int(scale_window)
        self.max_scale, self._clean, self.skipped = float(max_scale), 0, 0

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            self.loss_scale = max(self.loss_scale / self.scale_factor, 1.0)
            self._clean, self.skipped = 0, self.skipped + 1
            log.info("AMP: gradient overflow, step skipped; loss scale now %g", self.loss_scale)
            return
        self._clean += 1
        if self._clean == self.scale_window:
            self._clean = 0
            self.loss_scale = min(self.loss_scale * self.scale_factor, self.max_scale)

    def __repr__(self) -> str:
        return f"LossScaler(loss_scale={self.loss_scale:g}, skipped={self.skipped})"


def init(*_args, **_kwargs):
    """MXNet's ``amp.init()`` rewrites float32 operators to float16 ones as they run; dnnbind does not. Refused
    rather than ignored, so a program never trains in float32 believing it runs in float16."""
    raise NotImplementedError("amp.init() (automatic casting of float32 operators) is not supported by dnnbind: "
                              "cast the network instead, net.cast('float16'), feed float16 data, give the Trainer "
                              "multi_precision=True, then amp.init_trainer(trainer) and amp.scale_loss as usual")


def init_trainer(trainer, scaler: LossScaler | None = None) -> LossScaler:
    """Give ``trainer`` a dynamic loss scaler: its ``step`` then unscales the gradients and skips overflowed steps."""
    scaler = scaler or LossScaler()
    trainer._amp_loss_scaler = scaler
    trainer._amp_original_scale = trainer._scale
    return scaler


@contextlib.contextmanager
def scale_loss(loss, trainer):
    """``with amp.scale_loss(loss, trainer) as scaled: autograd.backward(scaled)``: the loss (or list of losses)
    times the current scale, and the trainer set to divide the gradients by it."""
    scaler = trainer._amp_loss_scaler
    if scaler is None:
        raise RuntimeError("amp.scale_loss: call amp.init_trainer(trainer) first")
    trainer._scale = trainer._amp_original_scale / scaler.loss_scale
    if isinstance(loss, (list, tuple)):
        yield [x * scaler.loss_scale for x in loss]
    else:
        yield loss * scaler.loss_scale


def unscale(trainer) -> None:
    """Divide the current gradients by the loss scale now (before clipping them by norm, say); the next step then
    rescales by the batch size only."""
    scaler = trainer._amp_loss_scaler
    if scaler is None:
        raise RuntimeError("amp.unscale: call amp.init_trainer(trainer) first")
    for p in trainer._params:
        if p.grad_req != "null" and p._grad is not None:
            for g in p.list_grad():  # every context's copy
                g.copy_(g * (1.0 / scaler.loss_scale))
    trainer._scale = trainer._amp_original_scale


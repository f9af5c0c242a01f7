"""Learning-rate schedules (``mxnet.lr_scheduler``) with MXNet 1.x semantics. Layer: gluon; imports nothing of
dnnbind (pure Python).

A scheduler is called with ``num_update`` (the largest number of updates applied to any weight) and returns
the learning rate to use. As in MXNet 1.9, schedulers keep state: ``FactorScheduler`` and
``MultiFactorScheduler`` lower ``base_lr`` in place as ``num_update`` passes each step boundary (so they
expect non-decreasing ``num_update``), and an optimizer given a scheduler overwrites its ``base_lr`` with the
optimizer's ``learning_rate``. Every scheduler can warm up for ``warmup_steps`` updates first, linearly from
``warmup_begin_lr`` to ``base_lr`` or at the constant ``warmup_begin_lr``.

Every number a scheduler is given must be finite and in range (``check_number``, shared with the optimizers):
MXNet 1.9 accepts ``base_lr=nan`` and returns NaN learning rates, which turn every weight into NaN at the
first update; here the constructor says which argument is wrong.
"""

from __future__ import annotations

from .._lib.errors import DnnbindTypeError, DnnbindValueError

import logging
import math

__all__ = ["CosineScheduler", "FactorScheduler", "LRScheduler", "MultiFactorScheduler", "PolyScheduler",
           "check_number"]

_log = logging.getLogger(__name__)


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_number(owner: str, name: str, value, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, none_ok: bool = False) -> float | None:
    """``value`` as a float when it is a finite real number in the range; else a DnnbindTypeError (not a number:
    None, str, bool, ...) or DnnbindValueError (NaN, inf, out of range) naming ``owner``, ``name`` and the value.
    None passes (as None) when ``none_ok``."""
    if value is None and none_ok:
        return None
    number = None
    if not isinstance(value, (bool, str, bytes)) and value is not None:
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if number is None:
        raise DnnbindTypeError(f"{owner}: {name} must be a number{' or None' if none_ok else ''}, got {value!r} "
                               f"({type(value).__name__})")
    if not math.isfinite(number) or (low is not None and (number <= low if low_open else number < low)) or \
            (high is not None and (number >= high if high_open else number > high)):
        rng = "" if low is None else " " + _interval(low, high, low_open, high_open)
        raise DnnbindValueError(f"{owner}: {name} must be a finite number{rng}{' or None' if none_ok else ''}, "
                                f"got {value!r}")
    return number


class LRScheduler:
    """Base class: holds ``base_lr`` and the warm-up; subclasses define ``__call__(num_update)``."""

    def __init__(self, base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0,
                 warmup_mode: str = "linear"):
        owner = type(self).__name__
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool):
            raise DnnbindTypeError(f"{owner}: warmup_steps must be an int, got {warmup_steps!r}")
        if warmup_steps < 0:
            raise DnnbindValueError(f"{owner}: warmup_steps must be >= 0, got {warmup_steps}")
        base_lr = check_number(owner, "base_lr", base_lr, 0)
        warmup_begin_lr = check_number(owner, "warmup_begin_lr", warmup_begin_lr, 0)
        if warmup_begin_lr > base_lr:
            raise DnnbindValueError(f"{owner}: base_lr ({base_lr}) must be >= warmup_begin_lr ({warmup_begin_lr})")
        if warmup_mode not in ("linear", "constant"):
            raise DnnbindValueError(f"{owner}: warmup_mode must be 'linear' or 'constant', got {warmup_mode!r}")
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.warmup_final_lr = base_lr
        self.warmup_begin_lr = warmup_begin_lr
        self.warmup_mode = warmup_mode

    def get_warmup_lr(self, num_update: int) -> float:
        if num_update >= self.warmup_steps:
            raise DnnbindValueError(f"get_warmup_lr: num_update {num_update} is past the {self.warmup_steps} "
                                    "warm-up steps")
        if self.warmup_mode == "constant":
            return self.warmup_begin_lr
        return self.warmup_begin_lr + (self.warmup_final_lr - self.warmup_begin_lr) * num_update / self.warmup_steps

    def __call__(self, num_update: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(num_update)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_lr={self.base_lr}, warmup_steps={self.warmup_steps})"


class FactorScheduler(LRScheduler):
    """``base_lr * factor ** k`` where ``k`` counts the passed multiples of ``step`` (lr changes once
    ``num_update`` exceeds ``step``, ``2 * step``, ...), never below ``stop_factor_lr``."""

    def __init__(self, step: int, factor: float = 1, stop_factor_lr: float = 1e-8, base_lr: float = 0.01,
                 warmup_steps: int = 0, warmup_begin_lr: float = 0, warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        check_number("FactorScheduler", "step", step, 1)
        if check_number("FactorScheduler", "factor", factor, 0) > 1.0:
            raise DnnbindValueError(f"FactorScheduler: factor must be <= 1 so the lr decreases, got {factor}")
        self.step = step
        self.factor = float(factor)
        self.stop_factor_lr = check_number("FactorScheduler", "stop_factor_lr", stop_factor_lr, 0)
        self.count = 0

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        # A loop, not an if: resuming at a later num_update (load_epoch) applies every passed step at once.
        while num_update > self.count + self.step:
            self.count += self.step
            self.base_lr *= self.factor
            if self.base_lr < self.stop_factor_lr:
                self.base_lr = self.stop_factor_lr
                _log.info("Update[%d]: now learning rate arrived at %0.5e, will not change in the future",
                          num_update, self.base_lr)
            else:
                _log.info("Update[%d]: Change learning rate to %0.5e", num_update, self.base_lr)
        return self.base_lr


class MultiFactorScheduler(LRScheduler):
    """Multiply the lr by ``factor`` once ``num_update`` exceeds each entry of the increasing list ``step``."""

    def __init__(self, step: list, factor: float = 1, base_lr: float = 0.01, warmup_steps: int = 0,
                 warmup_begin_lr: float = 0, warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if not isinstance(step, list) or not step:
            raise DnnbindValueError(f"MultiFactorScheduler: step must be a non-empty list of ints, got {step!r}")
        for i, s in enumerate(step):
            check_number("MultiFactorScheduler", f"step[{i}]", s, 1)
            if i and s <= step[i - 1]:
                raise DnnbindValueError(f"MultiFactorScheduler: step must be increasing, got {step}")
            if s < 1:
                raise DnnbindValueError(f"MultiFactorScheduler: every step must be >= 1, got {step}")
        if check_number("MultiFactorScheduler", "factor", factor, 0) > 1.0:
            raise DnnbindValueError(f"MultiFactorScheduler: factor must be <= 1 so the lr decreases, got {factor}")
        self.step = step
        self.cur_step_ind = 0
        self.factor = float(factor)
        self.count = 0

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        while self.cur_step_ind < len(self.step) and num_update > self.step[self.cur_step_ind]:
            self.count = self.step[self.cur_step_ind]
            self.cur_step_ind += 1
            self.base_lr *= self.factor
            _log.info("Update[%d]: Change learning rate to %0.5e", num_update, self.base_lr)
        return self.base_lr


class PolyScheduler(LRScheduler):
    """``final_lr + (base_lr - final_lr) * (1 - t / T) ** pwr`` with ``t`` counted after the warm-up and
    ``T = max_update - warmup_steps``; after ``max_update`` the last value stays."""

    def __init__(self, max_update: int, base_lr: float = 0.01, pwr: float = 2, final_lr: float = 0,
                 warmup_steps: int = 0, warmup_begin_lr: float = 0, warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        _check_max_update("PolyScheduler", max_update)
        self.power = check_number("PolyScheduler", "pwr", pwr, 0)
        self.base_lr_orig = self.base_lr
        self.max_update = max_update
        self.final_lr = check_number("PolyScheduler", "final_lr", final_lr, 0)
        self.max_steps = max_update - warmup_steps

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            frac = (num_update - self.warmup_steps) / self.max_steps if self.max_steps > 0 else 1.0
            self.base_lr = self.final_lr + (self.base_lr_orig - self.final_lr) * (1 - frac) ** self.power
        return self.base_lr


class CosineScheduler(LRScheduler):
    """``final_lr + (base_lr - final_lr) * (1 + cos(pi * t / T)) / 2`` with ``t`` counted after the warm-up
    and ``T = max_update - warmup_steps``; after ``max_update`` the last value stays."""

    def __init__(self, max_update: int, base_lr: float = 0.01, final_lr: float = 0, warmup_steps: int = 0,
                 warmup_begin_lr: float = 0, warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        _check_max_update("CosineScheduler", max_update)
        self.base_lr_orig = self.base_lr
        self.max_update = max_update
        self.final_lr = check_number("CosineScheduler", "final_lr", final_lr, 0)
        self.max_steps = max_update - warmup_steps

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            frac = (num_update - self.warmup_steps) / self.max_steps if self.max_steps > 0 else 1.0
            self.base_lr = self.final_lr + (self.base_lr_orig - self.final_lr) * (1 + math.cos(math.pi * frac)) / 2
        return self.base_lr


def _check_max_update(name: str, max_update) -> None:
    if not isinstance(max_update, int) or isinstance(max_update, bool):
        raise DnnbindTypeError(f"{name}: max_update must be an int, got {max_update!r}")
    if max_update < 1:
        raise DnnbindValueError(f"{name}: max_update must be >= 1, got {max_update}")

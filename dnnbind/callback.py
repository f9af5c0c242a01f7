"""``mx.callback``: the callbacks MXNet 1.x's ``Module.fit`` takes. Layer: top (imports model).

    mod.fit(train_iter, num_epoch=10,
            batch_end_callback=mx.callback.Speedometer(batch_size, 50),
            epoch_end_callback=mx.callback.do_checkpoint('mlp'))

Batch-end callbacks get a ``BatchEndParam`` (epoch, nbatch, eval_metric, locals); epoch-end callbacks get
``(epoch, symbol, arg_params, aux_params)``. The log lines are MXNet's, through the root logger as MXNet logs them.
"""

from __future__ import annotations

import logging
import math
import time

from .model import save_checkpoint

__all__ = ["LogValidationMetricsCallback", "ProgressBar", "Speedometer", "do_checkpoint", "log_train_metric",
           "module_checkpoint"]


def _period(period) -> int:
    return int(max(1, period))


def module_checkpoint(mod, prefix: str, period: int = 1, save_optimizer_states: bool = False):
    """An epoch-end callback: ``mod.save_checkpoint(prefix, epoch + 1)`` every ``period`` epochs."""
    period = _period(period)

    def _callback(iter_no, sym=None, arg=None, aux=None):
        if (iter_no + 1) % period == 0:
            mod.save_checkpoint(prefix, iter_no + 1, save_optimizer_states)
    return _callback


def do_checkpoint(prefix: str, period: int = 1):
    """An epoch-end callback writing ``prefix-symbol.json`` and ``prefix-%04d.params`` (epoch + 1) every
    ``period`` epochs."""
    period = _period(period)

    def _callback(iter_no, sym, arg, aux):
        if (iter_no + 1) % period == 0:
            save_checkpoint(prefix, iter_no + 1, sym, arg, aux)
            logging.info('Saved checkpoint to "%s-%04d.params"', prefix, iter_no + 1)
    return _callback


def log_train_metric(period: int, auto_reset: bool = False):
    """A batch-end callback logging ``Iter[epoch] Batch[n] Train-<metric>=<value>`` every ``period`` batches."""
    def _callback(param):
        if param.nbatch % period == 0 and param.eval_metric is not None:
            for name, value in param.eval_metric.get_name_value():
                logging.info("Iter[%d] Batch[%d] Train-%s=%f", param.epoch, param.nbatch, name, value)
            if auto_reset:
                param.eval_metric.reset_local()
    return _callback


class Speedometer:
    """A batch-end callback logging samples/sec and the training metric every ``frequent`` batches (resetting
    the metric after each line when ``auto_reset``)."""

    def __init__(self, batch_size: int, frequent: int = 50, auto_reset: bool = True):
        self.batch_size, self.frequent, self.auto_reset = batch_size, frequent, auto_reset
        self.init, self.tic, self.last_count = False, 0.0, 0

    def __call__(self, param) -> None:
        count = param.nbatch
        if self.last_count > count:  # a new epoch started: the clock starts again
            self.init = False
        self.last_count = count
        if not self.init:
            self.init, self.tic = True, time.time()
            return
        if count % self.frequent != 0:
            return
        elapsed = time.time() - self.tic
        speed = self.frequent * self.batch_size / elapsed if elapsed > 0 else float("inf")
        if param.eval_metric is None:
            logging.info("Iter[%d] Batch [%d]\tSpeed: %.2f samples/sec", param.epoch, count, speed)
        else:
            name_value = param.eval_metric.get_name_value()
            fields = [x for pair in name_value for x in pair]
            if self.auto_reset:
                param.eval_metric.reset_local()
                logging.info("Epoch[%d] Batch [%d-%d]\tSpeed: %.2f samples/sec" + "\t%s=%f" * len(name_value),
                             param.epoch, count - self.frequent, count, speed, *fields)
            else:
                logging.info("Epoch[%d] Batch [0-%d]\tSpeed: %.2f samples/sec" + "\t%s=%f" * len(name_value),
                             param.epoch, count, speed, *fields)
        self.tic = time.time()


class ProgressBar:
    """A batch-end callback drawing ``[====----] 50.0%`` for ``total`` batches an epoch."""

    def __init__(self, total: int, length: int = 80):
        self.bar_len, self.total = length, total

    def __call__(self, param) -> None:
        count = param.nbatch
        filled = int(round(self.bar_len * count / float(self.total)))
        percents = math.ceil(100.0 * count / float(self.total))
        bar = "=" * filled + "-" * (self.bar_len - filled)
        logging.info("[%s] %s%s\r", bar, percents, "%")


class LogValidationMetricsCallback:
    """An eval-end callback logging each validation metric as ``Epoch[%d] Validation-<name>=<value>``."""

    def __call__(self, param) -> None:
        if not param.eval_metric:
            return
        for name, value in param.eval_metric.get_name_value():
            logging.info("Epoch[%d] Validation-%s=%f", param.epoch, name, value)


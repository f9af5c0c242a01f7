"""``mx.mod`` / ``mx.module``: MXNet 1.x's Module API on dnnbind's symbol executor. Layer: top (imports symbol,
io, gluon's optimizer and metric, initializer, model, kvstore's updater).

    mod = mx.mod.Module(softmax, context=mx.gpu())
    mod.fit(train_iter, eval_data=val_iter, optimizer_params={'learning_rate': 0.1}, num_epoch=10)
    mod.save_checkpoint('mlp', 10)
    mod = mx.mod.Module.load('mlp', 10)
    preds = mod.predict(val_iter)

``BaseModule`` is the upper half (``fit``, ``score``, ``predict``, ``iter_predict``, checkpoints), written only
against the lower half that ``Module`` implements (``bind``, ``init_params``, ``init_optimizer``, ``forward``,
``backward``, ``update``, ``get_outputs``, ``update_metric``, ``get_params``/``set_params``), as in MXNet 1.9.1.

What MXNet does and dnnbind copies: parameters live in the executor and in a cpu copy (``get_params`` returns the
cpu copy, synchronised after updates); ``init_optimizer`` sets ``rescale_grad = 1/batch_size`` and, for an
optimizer given by name, MXNet's default multipliers (no weight decay on parameters whose name ends neither in
``_weight`` nor ``_gamma``; ``__lr_mult__``/``__wd_mult__`` symbol attributes); ``fit`` logs
``Epoch[%d] Train-<metric>=%f``, ``Epoch[%d] Time cost=%.3f`` and ``Epoch[%d] Validation-<metric>=%f``;
``predict`` strips the padded rows of the last batch.

Several contexts (``context=[gpu(0), gpu(1)]``, MXNet's data parallelism in one process): one executor per
context, bound for its slice of the batch (``work_load_list``, split as MXNet's ``_split_input_slice`` does, along
each input's ``layout`` batch axis); forward copies each slice to its device; ``get_outputs``/``get_input_grads``
concatenate the slices (``merge_multi_context=False``: a list of per-device arrays). ``update`` with a kvstore
('local', 'device', 'nccl') sums the gradients over the contexts (the gluon Trainer's machinery: one NCCL
all-reduce per flat gradient buffer on GPUs, a numpy sum on the host) and runs the updater on every device with
that sum, so every device keeps the same weights; with ``kvstore=None`` each device is updated with its own
gradient and the copies drift apart, as in MXNet 1.9.1. ``get_params`` averages the devices' copies (arguments
and auxiliary states, as MXNet's ``_sync_params_from_devices``). Where dnnbind differs: MXNet, with a 'local'
kvstore, runs the optimizer once on the store's copy (state keyed by parameter name, ``idx2name`` {i: name});
dnnbind runs it on each device with the summed gradient (state per ``i * num_device + k``, MXNet's kvstore=None
indices), which gives the same weights without copying them between devices.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import namedtuple

import numpy as np

from . import initializer as _init
from . import model as _model
from . import serialization
from ._lib.errors import DnnbindTypeError, DnnbindValueError
from .features import UnsupportedFeature
from .gluon import metric as _metric
from .gluon import optimizer as _opt
from .io import DataBatch, DataDesc, DataIter
from .gluon import grad_reduce as _reduce
from .gluon.grad_reduce import ALIGN
from .model import BatchEndParam
from .runtime.array import NDArray, array, zeros
from .runtime.device import as_device, cpu
from .symbol import Symbol

__all__ = ["BaseModule", "Module"]


class ModuleStateError(DnnbindValueError, AssertionError):
    """A Module method called out of order (forward before bind, ...): MXNet asserts; this is also an
    AssertionError so ``except AssertionError`` code keeps working, and says what to call first."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ModuleStateError(message)


def _as_list(obj) -> list:
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]


def _check_input_names(symbol: Symbol, names, typename: str, throw: bool) -> None:
    """MXNet's check that every data/label name is an argument of the symbol (an error for data, a warning for
    labels), with MXNet's message."""
    args = symbol.list_arguments()
    for name in names:
        if name in args:
            continue
        candidates = [a for a in args if not a.endswith(("_weight", "_bias", "_gamma", "_beta"))]
        msg = ("\033[91mYou created Module with Module(..., %s_names=%s) but input with name '%s' is not found in "
               "symbol.list_arguments(). Did you mean one of:\n\t%s\033[0m"
               % (typename, str(names), name, "\n\t".join(candidates)))
        if throw:
            raise DnnbindValueError(msg)
        warnings.warn(msg)


def _parse_data_desc(names: list, shapes, typename: str, throw: bool) -> list | None:
    """``shapes`` ((name, shape) pairs or DataDescs) as DataDescs, their names checked against ``names``."""
    if shapes is None:
        descs = None
        actual: list = []
    else:
        descs = [s if isinstance(s, DataDesc) else DataDesc(*s) for s in shapes]
        actual = [d.name for d in descs]
    if sorted(names) != sorted(actual):
        msg = "Data provided by %s_shapes don't match names specified by %s_names (%s vs. %s)" % (
            typename, typename, str(descs or []), str(names))
        if throw:
            raise DnnbindValueError(msg)
        warnings.warn(msg)
    return descs


_Mult = namedtuple("_Mult", ["lr_mult", "wd_mult"])


def _default_mults(symbol: Symbol, idx2name: dict) -> dict:
    """MXNet's Optimizer defaults for a Module's parameters (index -> lr_mult, wd_mult): no weight decay unless the
    name ends in ``_weight`` or ``_gamma``; ``__lr_mult__``/``__wd_mult__`` attributes of the symbol override."""
    attrs = symbol.attr_dict()
    mults = {}
    for index, name in idx2name.items():
        wd = 1.0 if name.endswith(("_weight", "_gamma")) else 0.0
        lr = 1.0
        a = attrs.get(name, {})
        if "__lr_mult__" in a:
            lr = float(a["__lr_mult__"])
        if "__wd_mult__" in a:
            wd = float(a["__wd_mult__"])
        mults[index] = _Mult(lr, wd)
    return mults


class BaseModule:
    """The upper half of MXNet's Module API, on top of the lower half a subclass implements."""

    def __init__(self, logger=logging):
        self.logger = logger
        self.binded = False
        self.for_training = False
        self.inputs_need_grad = False
        self.params_initialized = False
        self.optimizer_initialized = False
        self._symbol = None

    # -- composed from the lower half ------------------------------------------------------------------------
    def forward_backward(self, data_batch) -> None:
        self.forward(data_batch, is_train=True)
        self.backward()

    def prepare(self, data_batch, sparse_row_id_fn=None) -> None:
        """Nothing to prepare on one device (MXNet pulls row-sparse weights here)."""

    def score(self, eval_data, eval_metric, num_batch=None, batch_end_callback=None, score_end_callback=None,
              reset: bool = True, epoch: int = 0, sparse_row_id_fn=None) -> list:
        """Run ``eval_data`` through the model (padded rows included, as MXNet does) and return
        ``eval_metric.get_name_value()``."""
        _require(self.binded and self.params_initialized, "score: call bind and init_params first")
        if reset:
            eval_data.reset()
        if not isinstance(eval_metric, _metric.EvalMetric):
            eval_metric = _metric.create(eval_metric)
        eval_metric.reset()
        actual_num_batch = 0
        for nbatch, eval_batch in enumerate(eval_data):
            if num_batch is not None and nbatch == num_batch:
                break
            self.prepare(eval_batch, sparse_row_id_fn=sparse_row_id_fn)
            self.forward(eval_batch, is_train=False)
            self.update_metric(eval_metric, eval_batch.label)
            if batch_end_callback is not None:
                params = BatchEndParam(epoch=epoch, nbatch=nbatch, eval_metric=eval_metric, locals=locals())
                for callback in _as_list(batch_end_callback):
                    callback(params)
            actual_num_batch += 1
        if score_end_callback:
            params = BatchEndParam(epoch=epoch, nbatch=actual_num_batch, eval_metric=eval_metric, locals=locals())
            for callback in _as_list(score_end_callback):
                callback(params)
        return eval_metric.get_name_value()

    def iter_predict(self, eval_data, num_batch=None, reset: bool = True, sparse_row_id_fn=None):
        """Yield ``(outputs, nbatch, batch)`` per batch, the padded rows cut off the outputs."""
        _require(self.binded and self.params_initialized, "iter_predict: call bind and init_params first")
        if reset:
            eval_data.reset()
        for nbatch, eval_batch in enumerate(eval_data):
            if num_batch is not None and nbatch == num_batch:
                break
            self.prepare(eval_batch, sparse_row_id_fn=sparse_row_id_fn)
            self.forward(eval_batch, is_train=False)
            pad = eval_batch.pad or 0
            outputs = [out[0:out.shape[0] - pad] for out in self.get_outputs()]
            yield outputs, nbatch, eval_batch

    def predict(self, eval_data, num_batch=None, merge_batches: bool = True, reset: bool = True,
                always_output_list: bool = False, sparse_row_id_fn=None):
        """The outputs over ``eval_data`` (a DataIter, or one batch as an NDArray/numpy array), padded rows cut
        off; merged along the batch axis unless ``merge_batches=False`` (then a list per batch)."""
        _require(self.binded and self.params_initialized, "predict: call bind and init_params first")
        if isinstance(eval_data, (NDArray, np.ndarray)):
            if isinstance(eval_data, np.ndarray):
                eval_data = array(eval_data)
            self.forward(DataBatch([eval_data]))
            return self.get_outputs()[0]
        if not isinstance(eval_data, DataIter):
            raise DnnbindValueError("eval_data must be of type NDArray or DataIter")
        output_list = [[out.copy() for out in outputs]
                       for outputs, _, _ in self.iter_predict(eval_data, num_batch, reset, sparse_row_id_fn)]
        if not output_list:
            return output_list
        if merge_batches:
            from . import nd
            num_outputs = len(output_list[0])
            if any(len(out) != num_outputs for out in output_list):
                raise DnnbindValueError("Cannot merge batches, as num of outputs is not the same in mini-batches. "
                                        "Maybe bucketing is used?")
            merged = [nd.concatenate([out[i] for out in output_list]) for i in range(num_outputs)]
            if num_outputs == 1 and not always_output_list:
                return merged[0]
            return merged
        return output_list

    def fit(self, train_data, eval_data=None, eval_metric="acc", epoch_end_callback=None, batch_end_callback=None,
            kvstore="local", optimizer="sgd", optimizer_params=(("learning_rate", 0.01),), eval_end_callback=None,
            eval_batch_end_callback=None, initializer=None, arg_params=None, aux_params=None,
            allow_missing: bool = False, force_rebind: bool = False, force_init: bool = False, begin_epoch: int = 0,
            num_epoch=None, validation_metric=None, monitor=None, sparse_row_id_fn=None) -> None:
        """Bind, initialise and train for ``num_epoch - begin_epoch`` epochs (MXNet's BaseModule.fit)."""
        _require(num_epoch is not None, "please specify number of epochs")
        if initializer is None:
            initializer = _init.Uniform(0.01)
        self.bind(data_shapes=train_data.provide_data, label_shapes=train_data.provide_label, for_training=True,
                  force_rebind=force_rebind)
        if monitor is not None:
            self.install_monitor(monitor)
        self.init_params(initializer=initializer, arg_params=arg_params, aux_params=aux_params,
                         allow_missing=allow_missing, force_init=force_init)
        self.init_optimizer(kvstore=kvstore, optimizer=optimizer, optimizer_params=optimizer_params)
        if validation_metric is None:
            validation_metric = eval_metric
        if not isinstance(eval_metric, _metric.EvalMetric):
            eval_metric = _metric.create(eval_metric)

        for epoch in range(begin_epoch, num_epoch):
            tic = time.time()
            eval_metric.reset()
            nbatch = 0
            data_iter = iter(train_data)
            end_of_batch = False
            next_data_batch = next(data_iter)
            eval_name_vals: list = []
            while not end_of_batch:
                data_batch = next_data_batch
                # one step: forward, backward, update, then the metric on this batch's outputs
                self.forward_backward(data_batch)
                self.update()
                self.update_metric(eval_metric, data_batch.label)
                try:
                    next_data_batch = next(data_iter)
                    self.prepare(next_data_batch, sparse_row_id_fn=sparse_row_id_fn)
                except StopIteration:
                    end_of_batch = True
                if end_of_batch:
                    eval_name_vals = eval_metric.get_global_name_value()
                if batch_end_callback is not None:
                    params = BatchEndParam(epoch=epoch, nbatch=nbatch, eval_metric=eval_metric, locals=locals())
                    for callback in _as_list(batch_end_callback):
                        callback(params)
                nbatch += 1

            for name, val in eval_name_vals:
                self.logger.info("Epoch[%d] Train-%s=%f", epoch, name, val)
            self.logger.info("Epoch[%d] Time cost=%.3f", epoch, time.time() - tic)

            # sync the cpu copy of the parameters (what callbacks and checkpoints see)
            arg_params_, aux_params_ = self.get_params()
            self.set_params(arg_params_, aux_params_)
            if epoch_end_callback is not None:
                for callback in _as_list(epoch_end_callback):
                    callback(epoch, self.symbol, arg_params_, aux_params_)
            if eval_data:
                res = self.score(eval_data, validation_metric, score_end_callback=eval_end_callback,
                                 batch_end_callback=eval_batch_end_callback, epoch=epoch)
                for name, val in res:
                    self.logger.info("Epoch[%d] Validation-%s=%f", epoch, name, val)
            train_data.reset()

    # -- parameters in files ---------------------------------------------------------------------------------
    def save_params(self, fname: str) -> None:
        """``fname`` as MXNet's parameter file (``arg:<name>``/``aux:<name>``)."""
        arg_params, aux_params = self.get_params()
        save_dict = {f"arg:{k}": v.as_in_context(cpu()) for k, v in arg_params.items()}
        save_dict.update({f"aux:{k}": v.as_in_context(cpu()) for k, v in aux_params.items()})
        serialization.save(fname, save_dict)

    def load_params(self, fname: str) -> None:
        loaded = serialization.load(fname)
        arg_params, aux_params = {}, {}
        for key, value in (loaded.items() if isinstance(loaded, dict) else ()):
            kind, _, name = key.partition(":")
            if kind == "arg":
                arg_params[name] = value
            elif kind == "aux":
                aux_params[name] = value
            else:
                raise DnnbindValueError("Invalid param file " + fname)
        self.set_params(arg_params, aux_params)

    def install_monitor(self, mon) -> None:
        raise UnsupportedFeature("Module.install_monitor (mx.monitor) is not supported by dnnbind yet")

    @property
    def symbol(self) -> Symbol:
        return self._symbol


class Module(BaseModule):
    """A Symbol bound to one device or several (data parallelism), with parameters, an optimizer and MXNet's
    Module methods."""

    def __init__(self, symbol: Symbol, data_names=("data",), label_names=("softmax_label",), logger=logging,
                 context=None, work_load_list=None, fixed_param_names=None, state_names=None, group2ctxs=None,
                 compression_params=None):
        super().__init__(logger=logger)
        if not isinstance(symbol, Symbol):
            raise DnnbindTypeError(f"Module: symbol must be an mx.sym.Symbol, got {type(symbol).__name__}")
        if group2ctxs:
            raise UnsupportedFeature("Module(group2ctxs=...) (model parallelism) is not supported by dnnbind")
        contexts = _as_list(context) if context is not None else [cpu()]
        if not contexts:
            raise DnnbindValueError("Module: context is an empty list; give one context or a list of them")
        self._context = [as_device(c) for c in contexts]
        if len(self._context) > 1 and len({d.kind for d in self._context}) > 1:
            raise DnnbindValueError(f"Module: context={contexts} mixes cpu and gpu contexts; gradients are summed "
                                    "on GPUs (NCCL) or on the host, not across both. Use only GPUs or only the cpu.")
        self._work_load_list = _check_work_load(work_load_list, len(self._context))
        self._symbol = symbol
        self._data_names = list(data_names or [])
        self._label_names = list(label_names or [])
        self._state_names = list(state_names or [])
        self._fixed_param_names = list(fixed_param_names or [])
        _check_input_names(symbol, self._data_names, "data", True)
        _check_input_names(symbol, self._label_names, "label", False)
        _check_input_names(symbol, self._state_names, "state", True)
        _check_input_names(symbol, self._fixed_param_names, "fixed_param", True)
        inputs = set(self._data_names + self._label_names + self._state_names)
        self._param_names = [a for a in symbol.list_arguments() if a not in inputs]
        self._aux_names = symbol.list_auxiliary_states()
        self._output_names = symbol.list_outputs()
        self._arg_params: dict | None = None
        self._aux_params: dict | None = None
        self._params_dirty = False
        self._optimizer = None
        self._kvstore = None
        self._update_on_kvstore = False
        self._updater = None
        self._preload_opt_states = None
        self._grad_req = None
        self._exec = None  # the executor of the first context (the only one on one context)
        self._execs: list = []  # one per context
        self._slices: list | None = None  # the batch rows of each context (several contexts only)
        self._data_axes: list = []  # the batch axis of each data / label input (-1: none, copied whole)
        self._label_axes: list = []
        self._output_axes: list | None = None
        self._grads: _GradReplicas | None = None  # several contexts: the flat gradient buffers and their sum
        self._sum_grads = False  # several contexts and a kvstore: update() sums the gradients first
        self._data_shapes: list | None = None
        self._label_shapes: list | None = None

    @staticmethod
    def load(prefix: str, epoch: int, load_optimizer_states: bool = False, **kwargs) -> "Module":
        """A Module with the symbol and parameters of checkpoint ``prefix``/``epoch`` (bind it before use);
        ``load_optimizer_states`` reads ``prefix-%04d.states`` when the optimizer is initialised."""
        sym, args, auxs = _model.load_checkpoint(prefix, epoch)
        mod = Module(symbol=sym, **kwargs)
        mod._arg_params, mod._aux_params = args, auxs
        mod.params_initialized = True
        if load_optimizer_states:
            mod._preload_opt_states = "%s-%04d.states" % (prefix, epoch)
        return mod

    def save_checkpoint(self, prefix: str, epoch: int, save_optimizer_states: bool = False,
                        remove_amp_cast: bool = True) -> None:
        """``prefix-symbol.json``, ``prefix-%04d.params`` and, if asked, ``prefix-%04d.states``."""
        self._symbol.save("%s-symbol.json" % prefix, remove_amp_cast=remove_amp_cast)
        param_name = "%s-%04d.params" % (prefix, epoch)
        self.save_params(param_name)
        logging.info('Saved checkpoint to "%s"', param_name)
        if save_optimizer_states:
            state_name = "%s-%04d.states" % (prefix, epoch)
            self.save_optimizer_states(state_name)
            logging.info('Saved optimizer state to "%s"', state_name)

    # -- names and shapes ------------------------------------------------------------------------------------
    @property
    def data_names(self) -> list:
        return self._data_names

    @property
    def label_names(self) -> list:
        return self._label_names

    @property
    def output_names(self) -> list:
        return self._output_names

    @property
    def data_shapes(self) -> list:
        _require(self.binded, "data_shapes: call bind first")
        return self._data_shapes

    @property
    def label_shapes(self):
        _require(self.binded, "label_shapes: call bind first")
        return self._label_shapes

    @property
    def output_shapes(self) -> list:
        _require(self.binded, "output_shapes: call bind first")
        _, out_shapes, _ = self._symbol.infer_shape(**self._input_shapes())
        return list(zip(self._output_names, [tuple(s) for s in out_shapes]))

    def _input_shapes(self) -> dict:
        return {d.name: tuple(d.shape) for d in (self._data_shapes or []) + (self._label_shapes or [])}

    # -- parameters ------------------------------------------------------------------------------------------
    def get_params(self) -> tuple[dict, dict]:
        """(arg_params, aux_params): the cpu copies, brought up to date with the device's values."""
        _require(self.binded and self.params_initialized, "get_params: call bind and init_params first")
        if self._params_dirty:
            self._sync_params_from_devices()
        return self._arg_params, self._aux_params

    def init_params(self, initializer=_init.Uniform(0.01), arg_params=None, aux_params=None, allow_missing: bool = False,
                    force_init: bool = False, allow_extra: bool = False) -> None:
        """Fill the parameters from ``arg_params``/``aux_params`` and ``initializer`` (default Uniform(0.01);
        None with ``allow_missing`` leaves missing ones as they are)."""
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. init_params call ignored.",
                          stacklevel=2)
            return
        _require(self.binded, "call bind before initializing the parameters")
        attrs = self._symbol.attr_dict()

        def fill(name, arr, given):
            desc = _init.InitDesc(name, attrs.get(name))
            if given is not None:
                if name in given:
                    src = given[name]
                    if src is not arr:
                        _copy_into(arr, src, name)
                    return
                if not allow_missing:
                    raise RuntimeError("%s is not presented" % name)
            if initializer is not None:
                initializer(desc, arr)

        for name, arr in sorted(self._arg_params.items()):
            fill(name, arr, arg_params)
        for name, arr in sorted(self._aux_params.items()):
            fill(name, arr, aux_params)
        self.params_initialized = True
        self._params_dirty = False
        for exe in self._execs:
            exe.copy_params_from(self._arg_params, self._aux_params, allow_extra_params=allow_extra)

    def set_params(self, arg_params, aux_params, allow_missing: bool = False, force_init: bool = True,
                   allow_extra: bool = False) -> None:
        """Copy ``arg_params``/``aux_params`` into the module (all of them must be there unless
        ``allow_missing``)."""
        if not allow_missing:
            self.init_params(initializer=None, arg_params=arg_params, aux_params=aux_params,
                             allow_missing=allow_missing, force_init=force_init, allow_extra=allow_extra)
            return
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. set_params call ignored.",
                          stacklevel=2)
            return
        for exe in self._execs:
            exe.copy_params_from(arg_params, aux_params, allow_extra_params=allow_extra)
        self._params_dirty = True
        self.params_initialized = True

    def _sync_params_from_devices(self) -> None:
        if len(self._execs) > 1:
            self._average_params_from_devices()
            return
        for name, arr in self._arg_params.items():
            _copy_into(arr, self._exec.arg_dict[name], name)
        for name, arr in self._aux_params.items():
            _copy_into(arr, self._exec.aux_dict[name], name)
        self._params_dirty = False

    def _average_params_from_devices(self) -> None:
        """The cpu copies become the mean over the devices, arguments and auxiliary states alike, summed in
        context order and divided by their number (MXNet's DataParallelExecutorGroup.get_params): the same
        weights with a kvstore (identical copies), an average with kvstore=None, and BatchNorm's moving statistics
        (each device's own) averaged."""
        n = len(self._execs)
        for params, which in ((self._arg_params, "arg_dict"), (self._aux_params, "aux_dict")):
            for name, dst in params.items():
                total = None
                for exe in self._execs:
                    w = getattr(exe, which)[name].numpy()
                    total = w if total is None else np.add(total, w, out=total)
                _copy_into(dst, (total / n).astype(dst.dtype, copy=False), name)
        self._params_dirty = False

    # -- binding ---------------------------------------------------------------------------------------------
    def bind(self, data_shapes, label_shapes=None, for_training: bool = True, inputs_need_grad: bool = False,
             force_rebind: bool = False, shared_module=None, grad_req="write") -> None:
        """Allocate the executor for these input shapes (DataDescs or (name, shape) pairs)."""
        if force_rebind:
            self._reset_bind()
        if self.binded:
            self.logger.warning("Already bound, ignoring bind()")
            return
        if shared_module is not None:
            raise UnsupportedFeature("Module.bind(shared_module=...) (BucketingModule's memory sharing) is not "
                                     "supported by dnnbind yet")
        _require(for_training or not inputs_need_grad, "bind: inputs_need_grad needs for_training=True")
        self.for_training = for_training
        self.inputs_need_grad = inputs_need_grad
        self._grad_req = grad_req
        self._data_shapes = _parse_data_desc(self._data_names, data_shapes, "data", True)
        self._label_shapes = _parse_data_desc(self._label_names, label_shapes, "label", False)
        if len(self._context) == 1:
            self._exec = self._simple_bind()
            self._execs = [self._exec]
        else:
            self._bind_replicas(None)
        self.binded = True

        if self.params_initialized:  # re-bound (or loaded): the parameters we hold go into the new executors
            for exe in self._execs:
                exe.copy_params_from(self._arg_params, self._aux_params)
        else:
            _require(self._arg_params is None and self._aux_params is None, "bind: parameters without init")
            self._arg_params = {n: zeros(self._exec.arg_dict[n].shape, self._exec.arg_dict[n].dtype, cpu())
                                for n in self._param_names}
            self._aux_params = {n: zeros(a.shape, a.dtype, cpu()) for n, a in self._exec.aux_dict.items()}

    def _grad_reqs(self) -> dict:
        reqs = {}
        for name in self._symbol.list_arguments():
            if not self.for_training:
                reqs[name] = "null"
            elif name in self._param_names:
                req = self._grad_req if isinstance(self._grad_req, str) else dict(self._grad_req).get(name, "null")
                reqs[name] = "null" if name in self._fixed_param_names else req
            elif name in self._data_names:
                reqs[name] = self._grad_req if self.inputs_need_grad and isinstance(self._grad_req, str) else (
                    dict(self._grad_req).get(name, "null") if self.inputs_need_grad else "null")
            else:
                reqs[name] = "null"
        return reqs

    def _simple_bind(self):
        descs = (self._data_shapes or []) + (self._label_shapes or [])
        type_dict = {d.name: getattr(d, "dtype", np.float32) for d in descs}
        return self._symbol.simple_bind(self._context[0], grad_req=self._grad_reqs(), type_dict=type_dict,
                                        **self._input_shapes())

    def _reset_bind(self) -> None:
        self.binded = False
        self._exec = None
        self._execs = []
        self._slices = None
        self._grads = None
        self._data_shapes = None
        self._label_shapes = None

    def reshape(self, data_shapes, label_shapes=None) -> None:
        """Bind again for new input shapes, keeping the parameters (the new executor gets a copy; on several
        contexts the new executors share the old ones' parameter, gradient and auxiliary arrays)."""
        _require(self.binded, "reshape: call bind first")
        old = self._exec
        data_descs = _parse_data_desc(self._data_names, data_shapes, "data", True)
        label_descs = _parse_data_desc(self._label_names, label_shapes, "label", False)
        if len(self._context) > 1:
            old_shapes = (self._data_shapes, self._label_shapes)
            self._data_shapes, self._label_shapes = data_descs, label_descs
            try:
                self._bind_replicas(self._execs)
            except Exception:  # (a batch too small to split): stay bound as before
                self._data_shapes, self._label_shapes = old_shapes
                raise
            return
        self._data_shapes, self._label_shapes = data_descs, label_descs
        self._exec = self._simple_bind()
        self._execs = [self._exec]
        self._exec.copy_params_from({n: old.arg_dict[n] for n in self._param_names}, dict(old.aux_dict))

    # -- several contexts ------------------------------------------------------------------------------------
    def _bind_replicas(self, old_execs) -> None:
        """One executor per context, each bound for its slice of the batch. Parameter gradients are views of one
        flat buffer per dtype and context (_GradReplicas), so that summing them over the contexts is one
        all-reduce per buffer. ``old_execs`` (a reshape): the new executors take over their parameter, gradient
        and auxiliary arrays, so weights, BatchNorm statistics and the optimizer's state carry over untouched."""
        data, labels = self._data_shapes or [], self._label_shapes or []
        batch, self._data_axes = _batch_axes(data, None, "data_shapes")
        batch, self._label_axes = _batch_axes(labels, batch, "label_shapes")
        if batch is None:
            raise DnnbindValueError(f"Module.bind: several contexts ({self._context}) split the batch along the "
                                    f"batch axis, but no data shape has one (data_shapes={data})")
        slices = _split_batch(batch, self._work_load_list, data + labels)
        reqs = self._grad_reqs()
        type_dict = {d.name: getattr(d, "dtype", np.float32) for d in data + labels}
        execs = []
        for k, ctx in enumerate(self._context):
            rows = slices[k].stop - slices[k].start
            shapes = {d.name: _sliced(d.shape, axis, rows)
                      for d, axis in zip(data + labels, self._data_axes + self._label_axes)}
            # arrays of the right shapes and dtypes, no gradients: bound again below with the flat views
            execs.append(self._symbol.simple_bind(ctx, grad_req="null", type_dict=type_dict, **shapes))
        if old_execs is None:
            specs = [(n, execs[0].arg_dict[n].shape, execs[0].arg_dict[n].dtype) for n in self._param_names
                     if reqs[n] != "null"]
            self._grads = _GradReplicas([e._ctx for e in execs], specs, any(reqs[n] == "add" for n, _, _ in specs))
        names = self._symbol.list_arguments()
        for k, exe in enumerate(execs):
            args, auxs = dict(exe.arg_dict), dict(exe.aux_dict)
            if old_execs is not None:
                args.update({n: old_execs[k].arg_dict[n] for n in self._param_names})
                auxs = dict(old_execs[k].aux_dict)
            grads = {}
            for n in names:
                if reqs[n] == "null":
                    continue
                if n in self._grads.views[k]:
                    grads[n] = self._grads.views[k][n]
                elif old_execs is not None and n in old_execs[k].grad_dict and \
                        old_execs[k].grad_dict[n].shape == args[n].shape:
                    grads[n] = old_execs[k].grad_dict[n]
                else:  # an input's gradient (inputs_need_grad): each context its own
                    grads[n] = zeros(args[n].shape, args[n].dtype, exe._ctx)
            execs[k] = self._symbol.bind(exe._ctx, args=args, args_grad=grads or None,
                                         grad_req={n: reqs[n] if n in grads else "null" for n in names},
                                         aux_states=auxs)
        self._execs, self._exec, self._slices = execs, execs[0], slices
        if self._output_axes is None:
            self._output_axes = [DataDesc.get_batch_axis(self._symbol[i].attr("__layout__"))
                                 for i in range(len(self._output_names))]

    def _merged(self, per_exec: list, axes: list, merge: bool) -> list:
        """``per_exec[i]``: the i-th input/output of every executor; concatenated along its batch axis on the
        first context (merge), or as they are (a list of per-device arrays each)."""
        if not merge:
            return per_exec
        from . import nd
        dev = self._execs[0]._ctx
        out = []
        for arrays, axis in zip(per_exec, axes):
            if axis < 0:
                out.append(arrays[0])
            else:
                out.append(nd.concat(*[a.detach().as_in_context(dev) for a in arrays], dim=axis))
        return out

    # -- the optimizer ---------------------------------------------------------------------------------------
    def init_optimizer(self, kvstore="local", optimizer="sgd", optimizer_params=(("learning_rate", 0.01),),
                       force_init: bool = False) -> None:
        """The optimizer (a name and its parameters, or an Optimizer) with ``rescale_grad = 1/batch_size``."""
        _require(self.binded and self.params_initialized, "init_optimizer: call bind and init_params first")
        if self.optimizer_initialized and not force_init:
            self.logger.warning("optimizer already initialized, ignoring...")
            return
        if self._params_dirty:
            self._sync_params_from_devices()
        if kvstore is not None and not isinstance(kvstore, str):
            # a KVStore object (example/image-classification's fit.py makes one): with one process and one
            # device there is nothing to sum, so only its kind matters
            kind, workers = getattr(kvstore, "type", None), getattr(kvstore, "num_workers", 1)
            if not isinstance(kind, str):
                raise DnnbindTypeError(f"init_optimizer: kvstore must be None, a string or a KVStore, got "
                                       f"{type(kvstore).__name__}")
            if workers > 1:
                raise UnsupportedFeature(f"Module.init_optimizer(kvstore=<KVStore {kind!r} of {workers} workers>): "
                                         "distributed training of a Module is not supported by dnnbind yet")
            kvstore = kind if "dist" not in kind else "local"
        if isinstance(kvstore, str) and "dist" in kvstore:
            raise UnsupportedFeature(f"Module.init_optimizer(kvstore={kvstore!r}): distributed training of a Module "
                                     "is not supported by dnnbind yet")
        num_device = len(self._context)
        if num_device > 1:
            # MXNet makes a store of any other non-dist name ('local_allreduce_device', ...): all of them sum
            if kvstore is not None and not (kvstore.startswith("local") or kvstore in ("device", "nccl")):
                raise DnnbindValueError(f"Module.init_optimizer(kvstore={kvstore!r}): unknown kvstore for "
                                        f"{num_device} contexts; use 'local', 'device', 'nccl' or None")
            self._sum_grads = kvstore is not None
        batch_size = self._batch_size()
        rescale_grad = 1.0 / batch_size
        # MXNet's indices without an update on the store: parameter i on device k is i * num_device + k, so each
        # device's copy has its own optimizer state (one device: i)
        idx2name = {i * num_device + k: name for i, name in enumerate(self._param_names) for k in range(num_device)}
        if isinstance(optimizer, str):
            params = dict(optimizer_params)
            params.setdefault("rescale_grad", rescale_grad)
            optimizer = _opt.create(optimizer, sym=self._symbol, param_idx2name=idx2name, **params)
            for index, mult in _default_mults(self._symbol, idx2name).items():
                optimizer.param_dict.setdefault(index, mult)
        else:
            if not isinstance(optimizer, _opt.Optimizer):
                raise DnnbindTypeError(f"init_optimizer: optimizer must be a name or an mx.optimizer.Optimizer, "
                                       f"got {type(optimizer).__name__}")
            if optimizer.rescale_grad != rescale_grad:
                warnings.warn("Optimizer created manually outside Module but rescale_grad is not normalized to "
                              "1.0/batch_size/num_workers (%s vs. %s). Is this intended?"
                              % (optimizer.rescale_grad, rescale_grad), stacklevel=2)
            if not optimizer.idx2name:
                optimizer.idx2name = idx2name.copy()
        self._optimizer = optimizer
        self._kvstore = None
        self._update_on_kvstore = False
        self._updater = _opt.get_updater(optimizer)
        self.optimizer_initialized = True
        if self._preload_opt_states is not None:
            self.load_optimizer_states(self._preload_opt_states)
            self._preload_opt_states = None

    def _batch_size(self) -> int:
        desc = self._data_shapes[0]
        axis = DataDesc.get_batch_axis(getattr(desc, "layout", None))
        return int(desc.shape[max(axis, 0)])

    def save_optimizer_states(self, fname: str) -> None:
        _require(self.optimizer_initialized, "save_optimizer_states: call init_optimizer first")
        with open(fname, "wb") as f:
            f.write(self._updater.get_states())

    def load_optimizer_states(self, fname: str) -> None:
        _require(self.optimizer_initialized, "load_optimizer_states: call init_optimizer first")
        with open(fname, "rb") as f:
            self._updater.set_states(f.read())

    # -- computation -----------------------------------------------------------------------------------------
    def forward(self, data_batch, is_train=None) -> None:
        """Run the executor on ``data_batch`` (bound again first if its shapes differ from the bound ones);
        ``is_train`` None means ``for_training``."""
        _require(self.binded and self.params_initialized, "forward: call bind and init_params first")
        _require(data_batch is not None, "Encountered empty data batch")
        if isinstance(data_batch, (list, tuple)):  # one batch per context, already sliced
            if len(data_batch) != len(self._execs):
                raise DnnbindValueError(f"Module.forward: a list of {len(data_batch)} data batches for "
                                        f"{len(self._execs)} contexts; give one per context")
            if len(self._execs) > 1:
                self._forward_presliced(list(data_batch), is_train)
                return
            data_batch = data_batch[0]
        if len(self._execs) > 1:
            self._forward_replicas(data_batch, is_train)
            return
        data = list(data_batch.data)
        new_shapes = tuple(tuple(d.shape) for d in data)
        if new_shapes != tuple(tuple(d.shape) for d in self._data_shapes):
            provided = getattr(data_batch, "provide_data", None)
            new_dshape = provided if provided else [DataDesc(d.name, tuple(x.shape), d.dtype, d.layout)
                                                    for d, x in zip(self._data_shapes, data)]
            labels = data_batch.label or []
            provided = getattr(data_batch, "provide_label", None)
            if provided:
                new_lshape = provided
            elif self._label_shapes is not None and labels:
                new_lshape = [DataDesc(d.name, tuple(x.shape), d.dtype, d.layout)
                              for d, x in zip(self._label_shapes, labels)]
            else:
                new_lshape = None
            self.reshape(new_dshape, new_lshape)
        for name, value in zip(self._data_names, data):
            _copy_into(self._exec.arg_dict[name], value, name)
        if self._label_shapes is not None and data_batch.label:
            for name, value in zip(self._label_names, data_batch.label):
                _copy_into(self._exec.arg_dict[name], value, name)
        self._exec.forward(is_train=self.for_training if is_train is None else bool(is_train))

    def _reshape_for(self, data_batch, new_shapes: tuple) -> None:
        """Bind again when the batch's shapes differ from the bound ones (MXNet's forward)."""
        if new_shapes == tuple(tuple(d.shape) for d in self._data_shapes):
            return
        provided = getattr(data_batch, "provide_data", None)
        new_dshape = provided if provided else [DataDesc(d.name, shape, d.dtype, d.layout)
                                                for d, shape in zip(self._data_shapes, new_shapes)]
        labels = data_batch.label or []
        provided = getattr(data_batch, "provide_label", None)
        if provided:
            new_lshape = provided
        elif self._label_shapes is not None and labels:
            new_lshape = [DataDesc(d.name, tuple(x.shape), d.dtype, d.layout)
                          for d, x in zip(self._label_shapes, labels)]
        else:
            new_lshape = None
        self.reshape(new_dshape, new_lshape)

    def _forward_replicas(self, data_batch, is_train) -> None:
        """Several contexts: each executor gets its rows of every input, then runs."""
        data = list(data_batch.data)
        self._reshape_for(data_batch, tuple(tuple(d.shape) for d in data))
        labels = list(data_batch.label or []) if self._label_shapes is not None else []
        for exe, rows in zip(self._execs, self._slices):
            for name, value, axis in zip(self._data_names, data, self._data_axes):
                _copy_into(exe.arg_dict[name], _rows(value, axis, rows), name)
            for name, value, axis in zip(self._label_names, labels, self._label_axes):
                _copy_into(exe.arg_dict[name], _rows(value, axis, rows), name)
        train = self.for_training if is_train is None else bool(is_train)
        for exe in self._execs:
            exe.forward(is_train=train)

    def _forward_presliced(self, batches: list, is_train) -> None:
        """A list of batches, the k-th for context k (MXNet's forward of a list): the bound shapes are their
        concatenation along axis 0."""
        new_shapes = []
        for i in range(len(batches[0].data)):
            shape = tuple(batches[0].data[i].shape)
            if any(tuple(b.data[i].shape) != shape for b in batches):
                raise DnnbindValueError(f"Module.forward: all data batches in a list need to have the same shape; "
                                        f"data {i} has shapes {[tuple(b.data[i].shape) for b in batches]}")
            new_shapes.append((len(batches) * shape[0],) + shape[1:])
        if tuple(new_shapes) != tuple(tuple(d.shape) for d in self._data_shapes):
            dshape = [DataDesc(d.name, shape, d.dtype, d.layout) for d, shape in zip(self._data_shapes, new_shapes)]
            lshape = None
            if self._label_shapes is not None and batches[0].label:
                lshape = [DataDesc(d.name, (len(batches) * x.shape[0],) + tuple(x.shape[1:]), d.dtype, d.layout)
                          for d, x in zip(self._label_shapes, batches[0].label)]
            self.reshape(dshape, lshape)
        for exe, b in zip(self._execs, batches):
            for name, value in zip(self._data_names, b.data):
                _copy_into(exe.arg_dict[name], value, name)
            if self._label_shapes is not None and b.label:
                for name, value in zip(self._label_names, b.label):
                    _copy_into(exe.arg_dict[name], value, name)
        train = self.for_training if is_train is None else bool(is_train)
        for exe in self._execs:
            exe.forward(is_train=train)

    def backward(self, out_grads=None) -> None:
        _require(self.binded and self.params_initialized, "backward: call bind and init_params first")
        if len(self._execs) == 1:
            self._exec.backward(out_grads=out_grads)
            return
        _require(self.for_training, "backward: re-bind with for_training=True to run backward")
        if out_grads is not None and not isinstance(out_grads, (list, tuple)):
            out_grads = [out_grads]
        for exe, rows in zip(self._execs, self._slices):
            mine = None
            if out_grads is not None:  # each executor gets its rows of the head gradients, on its device
                mine = [_rows(g, axis, rows).as_in_context(exe._ctx) if isinstance(g, NDArray)
                        else array(np.asarray(_rows(g, axis, rows)), device=exe._ctx)
                        for g, axis in zip(out_grads, self._output_axes)]
            exe.backward(out_grads=mine)

    def update(self) -> None:
        """One optimizer step on every parameter with a gradient."""
        _require(self.binded and self.params_initialized and self.optimizer_initialized,
                 "update: call bind, init_params and init_optimizer first")
        self._params_dirty = True
        if len(self._execs) > 1:
            self._update_replicas()
            return
        for index, name in enumerate(self._param_names):
            grad = self._exec.grad_dict.get(name)
            if grad is None:  # fixed parameter
                continue
            self._updater(index, grad, self._exec.arg_dict[name])

    def _update_replicas(self) -> None:
        """Several contexts: the gradients summed over them (with a kvstore), then device k's copy of parameter i
        updated as index ``i * num_device + k``, device after device (MXNet's _update_params)."""
        grads = self._grads.summed() if self._sum_grads else self._grads.views
        n = len(self._execs)
        for k, exe in enumerate(self._execs):
            mine = grads[k]
            for i, name in enumerate(self._param_names):
                grad = mine.get(name)
                if grad is not None:  # (fixed parameters have none)
                    self._updater(i * n + k, grad, exe.arg_dict[name])

    def get_outputs(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized, "get_outputs: call bind and init_params first")
        if len(self._execs) == 1:
            return list(self._exec.outputs)
        per_exec = [[exe.outputs[i] for exe in self._execs] for i in range(len(self._output_names))]
        return self._merged(per_exec, self._output_axes, merge_multi_context)

    def get_input_grads(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized and self.inputs_need_grad,
                 "get_input_grads: bind with inputs_need_grad=True and call init_params first")
        if len(self._execs) == 1:
            return [self._exec.grad_dict[name] for name in self._data_names]
        per_exec = [[exe.grad_dict[name] for exe in self._execs] for name in self._data_names]
        return self._merged(per_exec, self._data_axes, merge_multi_context)

    def get_states(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized, "get_states: call bind and init_params first")
        if len(self._execs) > 1:
            if merge_multi_context:
                raise DnnbindValueError("Module.get_states(merge_multi_context=True) is not supported with several "
                                        "contexts (as in MXNet); pass merge_multi_context=False for a list of "
                                        "per-device arrays per state")
            return [[exe.arg_dict[name] for exe in self._execs] for name in self._state_names]
        return [self._exec.arg_dict[name] for name in self._state_names]

    def set_states(self, states=None, value=None) -> None:
        _require(self.binded and self.params_initialized, "set_states: call bind and init_params first")
        if len(self._execs) > 1:
            for i, name in enumerate(self._state_names):
                for k, exe in enumerate(self._execs):
                    dst = exe.arg_dict[name]
                    if states is None:
                        dst[:] = value
                    else:  # per state: a list of per-device arrays, or one array for every device
                        src = states[i][k] if isinstance(states[i], (list, tuple)) else states[i]
                        _copy_into(dst, src, name)
            return
        for i, name in enumerate(self._state_names):
            dst = self._exec.arg_dict[name]
            if states is not None:
                _copy_into(dst, states[i], name)
            else:
                dst[:] = value

    def update_metric(self, eval_metric, labels, pre_sliced: bool = False) -> None:
        """``eval_metric.update_dict`` with the labels by label name and the outputs by output name."""
        if len(self._execs) > 1:  # one update per context, with its rows of the labels (MXNet's order)
            for k, (exe, rows) in enumerate(zip(self._execs, self._slices)):
                mine = labels[k] if pre_sliced else [_rows(lab, axis, rows)
                                                     for lab, axis in zip(labels or [], self._label_axes)]
                eval_metric.update_dict(dict(zip(self._label_names, mine)), dict(zip(self._output_names,
                                                                                      exe.outputs)))
            return
        if pre_sliced:
            labels = labels[0]
        labels_ = dict(zip(self._label_names, labels or []))
        preds = dict(zip(self._output_names, self._exec.outputs))
        eval_metric.update_dict(labels_, preds)

    def borrow_optimizer(self, shared_module: "Module") -> None:
        _require(shared_module.optimizer_initialized, "borrow_optimizer: the shared module has no optimizer")
        self._optimizer = shared_module._optimizer
        self._kvstore = shared_module._kvstore
        self._update_on_kvstore = shared_module._update_on_kvstore
        self._updater = shared_module._updater
        self.optimizer_initialized = True


def _copy_into(dst: NDArray, src, name: str) -> None:
    """``dst[:] = src`` across devices and dtypes, with the shapes checked (MXNet's copyto)."""
    if tuple(src.shape) != tuple(dst.shape):
        raise DnnbindValueError(f"{name}: shape {tuple(src.shape)} does not match the bound shape {dst.shape}")
    if isinstance(src, NDArray):
        if src.device != dst.device:
            src = src.as_in_context(dst.device)
        if src.dtype != dst.dtype:
            src = src.astype(dst.dtype)
    else:
        src = np.asarray(src, dtype=dst.dtype)
    dst[:] = src


# -- several contexts: splitting the batch, summing the gradients ---------------------------------------------------

def _check_work_load(work_load_list, num_ctx: int) -> list:
    """``work_load_list`` (None: equal shares) as a list of non-negative numbers, one per context."""
    if work_load_list is None:
        return [1] * num_ctx
    if not isinstance(work_load_list, (list, tuple)):
        raise DnnbindTypeError(f"Module: work_load_list must be a list of numbers (one per context), got "
                               f"{type(work_load_list).__name__}")
    if len(work_load_list) != num_ctx:
        raise DnnbindValueError(f"Module: work_load_list has {len(work_load_list)} entries ({list(work_load_list)}) "
                                f"for {num_ctx} contexts; give one share per context")
    for w in work_load_list:
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not w >= 0:
            raise DnnbindValueError(f"Module: work_load_list={list(work_load_list)}: every share must be a "
                                    f"number >= 0, got {w!r}")
    if not sum(work_load_list) > 0:
        raise DnnbindValueError(f"Module: work_load_list={list(work_load_list)} sums to 0")
    return list(work_load_list)


def _batch_axes(descs: list, batch, what: str) -> tuple:
    """The batch axis of each desc (its layout's 'N', default 0; -1: none) and the batch size they share."""
    axes = []
    for d in descs:
        axis = DataDesc.get_batch_axis(getattr(d, "layout", None))
        axes.append(axis)
        if axis < 0:
            continue
        size = int(d.shape[axis])
        if batch is None:
            batch = size
        elif size != batch:
            raise DnnbindValueError(f"Module.bind: all inputs must have the same batch size: batch_size = {batch}, "
                                    f"but {what} {d.name} has shape {tuple(d.shape)} (batch axis {axis})")
    return batch, axes


def _split_batch(batch_size: int, work_load_list: list, descs: list) -> list:
    """The rows of each context: shares rounded (Python's round, as MXNet's _split_input_slice), the rounding
    shortfall to the last context, every slice clipped to the batch. An empty slice is an error."""
    total = sum(work_load_list)
    counts = [round(w * batch_size / total) for w in work_load_list]
    if sum(counts) < batch_size:
        counts[-1] += batch_size - sum(counts)
    slices, end = [], 0
    for k, count in enumerate(counts):
        begin = min(end, batch_size)
        end = min(begin + count, batch_size)
        if begin >= end:
            shapes = [(d.name, tuple(d.shape)) for d in descs]
            raise DnnbindValueError(f"Module: work_load_list={work_load_list} splits a batch of {batch_size} rows "
                                    f"(shapes {shapes}) over {len(work_load_list)} contexts as {counts} rows, which "
                                    f"leaves context {k} no rows (MXNet: Too many slices. Some splits are empty.); "
                                    "use a larger batch, fewer contexts or other shares")
        slices.append(slice(begin, end))
    return slices


def _sliced(shape, axis: int, rows: int) -> tuple:
    shape = list(shape)
    if axis >= 0:
        shape[axis] = rows
    return tuple(shape)


def _rows(value, axis: int, rows: slice):
    """``value``'s ``rows`` along ``axis`` (all of it for axis -1): a view along axis 0."""
    if axis < 0 or (rows.start == 0 and rows.stop == value.shape[axis]):
        return value
    if axis == 0:
        return value[rows.start:rows.stop]
    if isinstance(value, NDArray):
        from . import nd
        return nd.slice_axis(value, axis=axis, begin=rows.start, end=rows.stop)
    return np.asarray(value)[(slice(None),) * axis + (rows,)]


class _GradReplicas:
    """The parameter gradients of every context, as views of one flat buffer per dtype and context (the same
    offsets on every context), so that their sum over the contexts is one call per buffer of the gluon Trainer's
    reduction (gluon/grad_reduce.py): an in-place NCCL all-reduce per GPU issued as one group, or a numpy sum on
    the host. With grad_req 'add' the executors' buffers accumulate across steps, so the sum goes to separate buffers
    (as MXNet's update on the store leaves the gradients alone)."""

    def __init__(self, devices: list, specs: list, keep: bool):
        self.devices = devices
        offsets, totals = {}, {}
        for name, shape, dtype in specs:
            dtype = np.dtype(dtype)
            start = totals.get(dtype, 0)
            offsets[name] = (dtype, start, int(np.prod(shape, dtype=np.int64)), tuple(shape))
            totals[dtype] = (start + offsets[name][2] + ALIGN - 1) // ALIGN * ALIGN  # aligned for cuDNN/cuBLAS
        self.flats = [{dt: zeros((max(t, 1),), dt, dev) for dt, t in totals.items()} for dev in devices]
        self.views = [self._views(f, offsets) for f in self.flats]
        self._sums = [{dt: zeros(b.shape, dt, b.device) for dt, b in f.items()} for f in self.flats] if keep else None
        self._sum_views = [self._views(f, offsets) for f in self._sums] if keep else None
        self._offsets = offsets
        self._comms = None

    @staticmethod
    def _views(flats: dict, offsets: dict) -> dict:
        return {n: flats[dt][o:o + size].reshape(shape) for n, (dt, o, size, shape) in offsets.items()}

    def summed(self) -> list:
        """Every context's gradient views, now holding the sum over the contexts."""
        targets = self.flats
        if self._sums is not None:
            for mine, sums in zip(self.flats, self._sums):
                for dt, buf in mine.items():
                    sums[dt].copy_(buf)
            targets = self._sums
        for dt in targets[0]:
            bufs = [t[dt] for t in targets]
            if self.devices[0].kind == "cpu":
                _reduce.sum_on_host(bufs)
            elif len({d.index for d in self.devices}) == len(self.devices):
                if self._comms is None:
                    self._comms = _reduce.local_communicators(self.devices)
                _reduce.sum_on_devices(self._comms, bufs)
            else:  # one GPU named twice: NCCL needs distinct devices, so add copies on the first
                total = bufs[0].copy()
                for b in bufs[1:]:
                    total += b.as_in_context(total.device)
                for b in bufs:
                    b.copy_(total.as_in_context(b.device))
        return self._sum_views if self._sums is not None else self.views

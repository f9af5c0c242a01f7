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
``predict`` strips the padded rows of the last batch. One device per Module (no data parallelism yet);
kvstore 'local'/'device'/None only (one device needs none).
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
    """A Symbol bound to one device, with parameters, an optimizer and MXNet's Module methods."""

    def __init__(self, symbol: Symbol, data_names=("data",), label_names=("softmax_label",), logger=logging,
                 context=None, work_load_list=None, fixed_param_names=None, state_names=None, group2ctxs=None,
                 compression_params=None):
        super().__init__(logger=logger)
        if not isinstance(symbol, Symbol):
            raise DnnbindTypeError(f"Module: symbol must be an mx.sym.Symbol, got {type(symbol).__name__}")
        if group2ctxs:
            raise UnsupportedFeature("Module(group2ctxs=...) (model parallelism) is not supported by dnnbind")
        contexts = _as_list(context) if context is not None else [cpu()]
        if len(contexts) != 1:
            raise DnnbindValueError(f"Module: one context is supported for now, got {len(contexts)} ({contexts}); "
                                    "train on several devices with gluon.Trainer and a kvstore")
        self._context = [as_device(contexts[0])]
        self._work_load_list = work_load_list
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
        self._exec = None
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
        self._exec.copy_params_from(self._arg_params, self._aux_params, allow_extra_params=allow_extra)

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
        self._exec.copy_params_from(arg_params, aux_params, allow_extra_params=allow_extra)
        self._params_dirty = True
        self.params_initialized = True

    def _sync_params_from_devices(self) -> None:
        for name, arr in self._arg_params.items():
            _copy_into(arr, self._exec.arg_dict[name], name)
        for name, arr in self._aux_params.items():
            _copy_into(arr, self._exec.aux_dict[name], name)
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
        self._exec = self._simple_bind()
        self.binded = True

        if self.params_initialized:  # re-bound (or loaded): the parameters we hold go into the new executor
            self._exec.copy_params_from(self._arg_params, self._aux_params)
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
        self._data_shapes = None
        self._label_shapes = None

    def reshape(self, data_shapes, label_shapes=None) -> None:
        """Bind again for new input shapes, keeping the parameters (the new executor gets a copy)."""
        _require(self.binded, "reshape: call bind first")
        old = self._exec
        self._data_shapes = _parse_data_desc(self._data_names, data_shapes, "data", True)
        self._label_shapes = _parse_data_desc(self._label_names, label_shapes, "label", False)
        self._exec = self._simple_bind()
        self._exec.copy_params_from({n: old.arg_dict[n] for n in self._param_names}, dict(old.aux_dict))

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
        batch_size = self._batch_size()
        rescale_grad = 1.0 / batch_size
        idx2name = dict(enumerate(self._param_names))  # one device: index i*num_device + k is i
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
        if isinstance(data_batch, (list, tuple)):
            raise UnsupportedFeature("Module.forward with a list of pre-sliced batches (several devices) is not "
                                     "supported by dnnbind yet")
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

    def backward(self, out_grads=None) -> None:
        _require(self.binded and self.params_initialized, "backward: call bind and init_params first")
        self._exec.backward(out_grads=out_grads)

    def update(self) -> None:
        """One optimizer step on every parameter with a gradient."""
        _require(self.binded and self.params_initialized and self.optimizer_initialized,
                 "update: call bind, init_params and init_optimizer first")
        self._params_dirty = True
        for index, name in enumerate(self._param_names):
            grad = self._exec.grad_dict.get(name)
            if grad is None:  # fixed parameter
                continue
            self._updater(index, grad, self._exec.arg_dict[name])

    def get_outputs(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized, "get_outputs: call bind and init_params first")
        return list(self._exec.outputs)

    def get_input_grads(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized and self.inputs_need_grad,
                 "get_input_grads: bind with inputs_need_grad=True and call init_params first")
        return [self._exec.grad_dict[name] for name in self._data_names]

    def get_states(self, merge_multi_context: bool = True) -> list:
        _require(self.binded and self.params_initialized, "get_states: call bind and init_params first")
        return [self._exec.arg_dict[name] for name in self._state_names]

    def set_states(self, states=None, value=None) -> None:
        _require(self.binded and self.params_initialized, "set_states: call bind and init_params first")
        for i, name in enumerate(self._state_names):
            dst = self._exec.arg_dict[name]
            if states is not None:
                _copy_into(dst, states[i], name)
            else:
                dst[:] = value

    def update_metric(self, eval_metric, labels, pre_sliced: bool = False) -> None:
        """``eval_metric.update_dict`` with the labels by label name and the outputs by output name."""
        if pre_sliced:
            raise UnsupportedFeature("update_metric(pre_sliced=True) (several devices) is not supported by dnnbind")
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

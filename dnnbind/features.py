"""MXNet 1.9.1's public names, and the error for one that dnnbind does not back. Layer: bottom (stdlib only, imports
nothing of dnnbind), so Gluon's Block, Parameter and nn and the MXNet alias above them raise the same error.

``NAMES``: the public names of MXNet 1.9.1's namespaces and Gluon classes (``dir()`` without ``_`` names, read from
the real MXNet; tests/fixtures/mxnet_gluon/names.json holds the same lists and a test keeps both equal). A name
listed here that dnnbind lacks is an MXNet feature dnnbind does not back: ``missing()`` gives ``UnsupportedFeature``
naming it. A name listed nowhere is a typo: a plain AttributeError.
"""

from __future__ import annotations

import types

NAMES: dict[str, frozenset] = {
    "mx": frozenset("""
        AttrScope Context MXNetError api attribute autograd base callback context contrib cpu cpu_pinned
        current_context engine error executor executor_manager gluon gpu image img init initializer io
        is_np_array is_np_shape kv kvstore libinfo library log lr_scheduler metric mod model module mon
        monitor name nd ndarray ndarray_doc notebook np np_array np_shape np_symbol npx numpy
        numpy_dispatch_protocol numpy_extension numpy_op_fallback numpy_op_signature onnx operator optimizer
        profiler random recordio registry rnd rnn rtc runtime set_np_shape sym symbol symbol_doc test_utils th
        torch tvmop use_np use_np_array use_np_shape util visualization viz
    """.split()),
    "gluon": frozenset("""
        Block Constant DeferredInitializationError HybridBlock Parameter ParameterDict SymbolBlock Trainer
        block contrib data loss model_zoo nn parameter rnn tensor_types trainer utils
    """.split()),
    "nn": frozenset("""
        Activation AvgPool1D AvgPool2D AvgPool3D BatchNorm BatchNormReLU Block Conv1D Conv1DTranspose Conv2D
        Conv2DTranspose Conv3D Conv3DTranspose Dense Dropout ELU Embedding Flatten GELU GlobalAvgPool1D
        GlobalAvgPool2D GlobalAvgPool3D GlobalMaxPool1D GlobalMaxPool2D GlobalMaxPool3D GroupNorm HybridBlock
        HybridLambda HybridSequential InstanceNorm Lambda LayerNorm LeakyReLU MaxPool1D MaxPool2D MaxPool3D
        PReLU ReflectionPad2D SELU Sequential Swish SymbolBlock activations basic_layers conv_layers
    """.split()),
    "nd": frozenset("""
        Activation BatchNorm BatchNorm_v1 BilinearSampler BlockGrad CTCLoss CachedOp Cast Concat Convolution
        Convolution_v1 Correlation Crop Custom Deconvolution Dropout ElementWiseSum Embedding Flatten
        FullyConnected GridGenerator GroupNorm IdentityAttachKLSparseReg InstanceNorm L2Normalization LRN
        LayerNorm LeakyReLU LinearRegressionOutput LogisticRegressionOutput MAERegressionOutput MakeLoss
        NDArray Pad Pooling Pooling_v1 RNN ROIPooling Reshape SVMOutput SequenceLast SequenceMask
        SequenceReverse SliceChannel Softmax SoftmaxActivation SoftmaxOutput SpatialTransformer SwapAxis
        UpSampling abs adam_update add add_n all_finite amp_cast amp_multicast arange arccos arccosh arcsin
        arcsinh arctan arctanh argmax argmax_channel argmin argsort array batch_dot batch_take broadcast_add
        broadcast_axes broadcast_axis broadcast_div broadcast_equal broadcast_greater broadcast_greater_equal
        broadcast_hypot broadcast_lesser broadcast_lesser_equal broadcast_like broadcast_logical_and
        broadcast_logical_or broadcast_logical_xor broadcast_maximum broadcast_minimum broadcast_minus
        broadcast_mod broadcast_mul broadcast_not_equal broadcast_plus broadcast_power broadcast_sub
        broadcast_to cast cast_storage cbrt ceil choose_element_0index clip col2im concat concatenate contrib
        cos cosh crop ctc_loss cumsum degrees depth_to_space diag divide dot elemwise_add elemwise_div
        elemwise_mul elemwise_sub empty equal erf erfinv exp expand_dims expm1 eye fill_element_0index fix
        flatten flip floor from_dlpack from_numpy ftml_update ftrl_update full gamma gammaln gather_nd
        gen__internal gen_contrib gen_image gen_linalg gen_op gen_sparse get_indexing_dispatch_code
        get_oshape_of_gather_nd_op greater greater_equal hard_sigmoid histogram identity im2col image imdecode
        indexing_key_expand_implicit_axes khatri_rao lamb_update_phase1 lamb_update_phase2 lesser lesser_equal
        linalg linalg_det linalg_extractdiag linalg_extracttrian linalg_gelqf linalg_gemm linalg_gemm2
        linalg_inverse linalg_makediag linalg_maketrian linalg_potrf linalg_potri linalg_slogdet
        linalg_sumlogdiag linalg_syrk linalg_trmm linalg_trsm linspace load load_frombuffer log log10 log1p
        log2 log_softmax logical_and logical_not logical_or logical_xor make_loss max max_axis maximum mean
        min min_axis minimum modulo moments moveaxis mp_lamb_update_phase1 mp_lamb_update_phase2
        mp_nag_mom_update mp_sgd_mom_update mp_sgd_update multi_all_finite multi_lars multi_mp_sgd_mom_update
        multi_mp_sgd_update multi_sgd_mom_update multi_sgd_update multi_sum_sq multiply nag_mom_update nanprod
        nansum ndarray negative norm normal not_equal np npx numpy numpy_extension one_hot onehot_encode ones
        ones_like op pad pick power preloaded_multi_mp_sgd_mom_update preloaded_multi_mp_sgd_update
        preloaded_multi_sgd_mom_update preloaded_multi_sgd_update prod radians random random_exponential
        random_gamma random_generalized_negative_binomial random_negative_binomial random_normal
        random_pdf_dirichlet random_pdf_exponential random_pdf_gamma random_pdf_generalized_negative_binomial
        random_pdf_negative_binomial random_pdf_normal random_pdf_poisson random_pdf_uniform random_poisson
        random_randint random_uniform ravel_multi_index rcbrt reciprocal register relu repeat reset_arrays
        reshape reshape_like reverse rint rmsprop_update rmspropalex_update round rsqrt sample_exponential
        sample_gamma sample_generalized_negative_binomial sample_multinomial sample_negative_binomial
        sample_normal sample_poisson sample_uniform save scatter_nd sgd_mom_update sgd_update shape_array
        shuffle sigmoid sign signsgd_update signum_update sin sinh size_array slice slice_axis slice_like
        smooth_l1 softmax softmax_cross_entropy softmin softsign sort space_to_depth sparse split split_v2
        sqrt square squeeze stack stop_gradient subtract sum sum_axis swapaxes take tan tanh tile
        to_dlpack_for_read to_dlpack_for_write topk transpose true_divide trunc uniform unravel_index utils
        waitall where zeros zeros_like
    """.split()),
    "base": frozenset("""
        CachedOpHandle CudaKernelHandle CudaModuleHandle DLPackHandle DataIterCreatorHandle DataIterHandle
        ExecutorHandle FunctionHandle KVStoreHandle MXCallbackList MXNetError NDArrayHandle
        NotImplementedForSymbol NotSupportedForSparseNDArray OpHandle ProfileHandle RecordIOHandle RtcHandle
        SymbolHandle add_fileline_to_docstring atexit basestring build_param_doc c2pyerror c_array c_array_buf
        c_handle_array c_str c_str_array check_call classproperty ctypes ctypes2buffer ctypes2numpy_shared
        data_dir data_dir_default error_types get_last_ffi_error inspect integer_types libinfo long mx_float
        mx_float_p mx_int mx_int64 mx_real_t mx_uint numeric_types os platform py_str re register_error
        string_types sys with_metaclass
    """.split()),
    "image": frozenset("""
        Augmenter BrightnessJitterAug CastAug CenterCropAug ColorJitterAug ColorNormalizeAug ContrastJitterAug
        CreateAugmenter CreateDetAugmenter CreateMultiRandCropAugmenter DetAugmenter DetBorrowAug
        DetHorizontalFlipAug DetRandomCropAug DetRandomPadAug DetRandomSelectAug ForceResizeAug
        HorizontalFlipAug HueJitterAug ImageDetIter ImageIter LightingAug Number RandomCropAug RandomGrayAug
        RandomOrderAug RandomSizedCropAug ResizeAug SaturationJitterAug SequentialAug center_crop
        color_normalize copyMakeBorder cv2 det detection fixed_crop image imdecode imread imresize imrotate io
        is_np_array json logging nd np numeric_types os random random_crop random_rotate random_size_crop
        recordio resize_short scale_down sys warnings
    """.split()),
    "test_utils": frozenset("""
        Context DummyIter Features OrderedDict Symbol almost_equal array assert_allclose assert_almost_equal
        assert_almost_equal_ignore_nan assert_almost_equal_with_err assert_exception assign_each assign_each2
        bz2 checkShapes check_consistency check_gluon_hybridize_consistency check_numeric_gradient check_speed
        check_symbolic_backward check_symbolic_forward chi_square_check collapse_sum_like
        compare_ndarray_tuple compare_optimizer contextmanager create_2d_tensor create_sparse_array
        create_sparse_array_zd create_vector current_context default_atols default_context default_dtype
        default_numeric_eps default_rtols discard_stderr download download_model effective_dtype environment
        errno gen_buckets_probs_with_ppf get_atol get_bz2_data get_cifar10 get_cuda_compute_capability
        get_etol get_identity_mat get_identity_mat_batch get_im2rec_path get_mnist get_mnist_iterator
        get_mnist_pkl get_mnist_ubyte get_rtol get_tolerance get_tols get_zip_data getenv gzip has_tvm_ops
        is_aarch64_run is_cd_run is_op_runnable json list_gpus locationError logging mean_check mx
        new_matrix_with_real_eigvals_2d new_matrix_with_real_eigvals_nd new_orthonormal_matrix_2d
        new_sym_matrix_with_real_eigvals_2d new_sym_matrix_with_real_eigvals_nd np np_reduce np_symbol npt
        numbers numeric_grad os platform rand_coord_2d rand_ndarray rand_shape_2d rand_shape_3d rand_shape_nd
        rand_sparse_ndarray random_arrays random_sample random_uniform_arrays requests retry rnd same
        same_array same_symbol_structure set_default_context setenv shuffle_csr_column_indices simple_forward
        ss struct sys time traceback use_np var_check verify_generator zipfile
    """.split()),
    "io": frozenset("""
        CSVIter DataBatch DataDesc DataIter ImageDetRecordIter ImageRecordInt8Iter ImageRecordIter ImageRecordIter_v1
        ImageRecordUInt8Iter ImageRecordUInt8Iter_v1 LibSVMIter MNISTIter MXDataIter NDArrayIter PrefetchingIter
        ResizeIter io utils
    """.split()),
    "Block": frozenset("""
        apply cast collect_params forward hybridize initialize load load_parameters load_params name
        name_scope params prefix register_child register_forward_hook register_forward_pre_hook
        register_op_hook save save_parameters save_params summary
    """.split()),
    "HybridBlock": frozenset("""
        apply cast collect_params export forward hybrid_forward hybridize infer_shape infer_type initialize
        load load_parameters load_params name name_scope optimize_for params prefix register_child
        register_forward_hook register_forward_pre_hook register_op_hook save save_parameters save_params
        summary
    """.split()),
    "Parameter": frozenset("""
        cast data dtype grad grad_req initialize list_ctx list_data list_grad list_row_sparse_data reset_ctx
        row_sparse_data set_data shape var zero_grad
    """.split()),
    "ParameterDict": frozenset("""
        get get_constant initialize items keys list_ctx load load_dict prefix reset_ctx save setattr update
        values zero_grad
    """.split()),
}


class UnsupportedFeature(NotImplementedError, AttributeError):
    """The first use of an MXNet name dnnbind does not back. A NotImplementedError, as the alias promises, and
    an AttributeError, because it comes from a module's ``__getattr__``: ``hasattr``, ``getattr(m, n, default)``
    and pickle's ``whichmodule`` (which torch.compile runs over every loaded module) expect one."""


# Where each key of NAMES lives in MXNet, for messages.
PATHS = {"mx": "mxnet", "gluon": "mxnet.gluon", "nn": "mxnet.gluon.nn", "nd": "mxnet.nd", "base": "mxnet.base",
         "image": "mxnet.image", "test_utils": "mxnet.test_utils", "io": "mxnet.io", "Block": "mxnet.gluon.Block",
         "HybridBlock": "mxnet.gluon.HybridBlock", "Parameter": "mxnet.gluon.Parameter",
         "ParameterDict": "mxnet.gluon.ParameterDict"}


def missing(ns: str, name: str, hint: str = "", obj=None) -> AttributeError:
    """The error for ``name``, which dnnbind's counterpart of ``ns`` (a key of NAMES) lacks: UnsupportedFeature
    naming the feature when MXNet 1.9.1 has it, else a plain AttributeError (a typo). ``obj``: the object read,
    for the message and Python's "Did you mean" suggestion. Returned, for the caller to raise."""
    if name in NAMES[ns]:
        used = f" ({type(obj).__name__}.{name} was used)" if obj is not None and \
            not isinstance(obj, (type, types.ModuleType)) else ""
        return UnsupportedFeature(f"{PATHS[ns]}.{name} is not supported by dnnbind yet{used}"
                                  + (f": {hint}" if hint else ""))
    if obj is None or isinstance(obj, types.ModuleType):
        return AttributeError(f"module {PATHS[ns]!r} (dnnbind) has no attribute {name!r}", name=name, obj=obj)
    return AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}", name=name, obj=obj)

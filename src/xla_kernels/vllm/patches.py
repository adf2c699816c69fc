"""The changes to tpu-inference 0.32.0 (and two to vLLM 0.32.0 and JAX 0.11.2) that let
tpu-inference's runner work where JAX has no TPU.

Each patch replaces one method or function of the pinned release with a function here whose
docstring says what upstream does and why we change it. Upstream's source is pinned by a
hash: :func:`apply_all` refuses to patch a function whose source differs (a new release may
already have fixed it, or changed what our replacement relies on), and tests/vllm checks the
hashes against the installed release. Patches are applied only on
:class:`~xla_kernels.vllm.platform.XlaKernelsPlatform` (:func:`xla_kernels.vllm.register`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

PINNED = {"tpu-inference": "0.32.0", "vllm-tpu": "0.32.0", "jax": "0.11.2"}


class PatchDriftError(RuntimeError):
    """The installed vLLM, tpu-inference or JAX changed a function that a patch replaces."""


@dataclass(frozen=True)
class Patch:
    """Replace ``owner.name`` (owner: ``"module"`` or ``"module:Class"``)."""

    owner: str
    name: str
    sha256: str
    """sha256 of ``inspect.getsource`` of upstream's function, in the pinned release."""
    replacement: Callable
    kind: str = "function"
    """``function``, ``method`` (called on instances), ``classmethod`` or ``staticmethod``."""

    @property
    def where(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"

    def resolve(self) -> object:
        module_name, _, cls_name = self.owner.partition(":")
        obj = importlib.import_module(module_name)
        return getattr(obj, cls_name) if cls_name else obj

    def upstream(self) -> Callable:
        """The function the pinned release has there (also after :meth:`apply`)."""
        owner = self.resolve()
        current = inspect.getattr_static(owner, self.name)
        current = getattr(current, "__func__", current)
        return getattr(current, "__xk_upstream__", current)

    def source_hash(self) -> str:
        return hashlib.sha256(inspect.getsource(self.upstream()).encode()).hexdigest()

    def check(self) -> None:
        """Raise :class:`PatchDriftError` if upstream's function is not the pinned one."""
        found = self.source_hash()
        if found != self.sha256:
            raise PatchDriftError(
                f"xla_kernels.vllm patch {self.replacement.__name__!r}: upstream "
                f"{self.where} is not the function this patch was written for (sha256 "
                f"{found[:12]}, expected {self.sha256[:12]}; pinned {PINNED}). Fix: install "
                f"the pinned versions (scripts/vllm_env.sh), or re-read {self.where} in the "
                f"new release and update the patch and its hash in "
                f"xla_kernels/vllm/patches.py")

    def is_applied(self) -> bool:
        current = inspect.getattr_static(self.resolve(), self.name)
        current = getattr(current, "__func__", current)
        return getattr(current, "__xk_upstream__", None) is not None

    def apply(self) -> None:
        if self.is_applied():
            return
        self.check()
        owner = self.resolve()
        upstream = self.upstream()

        def bound(*args, **kwargs):
            return self.replacement(upstream, *args, **kwargs)

        bound.__xk_upstream__ = upstream
        bound.__name__ = self.name
        bound.__doc__ = self.replacement.__doc__
        wrap = {"classmethod": classmethod, "staticmethod": staticmethod}.get(self.kind)
        setattr(owner, self.name, wrap(bound) if wrap else bound)


def applied() -> list[str]:
    """The patched places, for reports."""
    return [p.where for p in PATCHES if p.is_applied()]


def _jax_has_tpu() -> bool:
    import jax

    return jax.devices()[0].platform == "tpu"


def plain_2d_mesh(upstream, runner):
    """``TPUModelRunner._create_2d_mesh`` builds the (data, model) mesh through
    ``make_optimized_mesh``, which sorts the devices by ``device.coords``, an attribute only
    TPU devices have (AttributeError on CPU and GPU). Off TPU we build the mesh in device
    order, which is what upstream does when the user fixes the device order."""
    if _jax_has_tpu():
        return upstream(runner)
    import jax
    import numpy as np
    from tpu_inference.runner.tpu_runner import MESH_AXIS_NAMES_2D

    strategy = runner.vllm_config.sharding_config
    shape = (strategy.model_dp_size, strategy.tp_size)
    count = int(np.prod(shape))
    if len(runner.devices) < count:
        raise ValueError(f"xla_kernels.vllm: mesh {shape} needs {count} devices, JAX has "
                         f"{len(runner.devices)}. Fix: lower tensor/data parallel sizes")
    return jax.sharding.Mesh(np.array(runner.devices[:count]).reshape(shape),
                             MESH_AXIS_NAMES_2D)


MEMORY_ENV = "XLA_KERNELS_VLLM_DEVICE_MEMORY_GB"


def device_memory_limit(upstream):
    """``tpu_inference.utils.get_device_hbm_limit`` returns the HBM size of the TPU
    generation ``jax.devices()[0].device_kind`` names, and raises "Expected TPU devices" on
    any other device. The runner sizes the KV cache from it when a device reports no memory
    statistics, which JAX's CPU devices don't (GPUs do, so this is never reached there). Off
    TPU we return ``$XLA_KERNELS_VLLM_DEVICE_MEMORY_GB`` GiB (default 4): the CPU "device"
    is host memory, and vLLM takes ``gpu_memory_utilization`` of this for weights and cache."""
    if _jax_has_tpu():
        return upstream()
    from xla_kernels import env

    return int(float(env.get(MEMORY_ENV)) * (1 << 30))


def drop_tpu_compile_options(upstream, *args, **kwargs):
    """``jax._src.compiler.get_compile_options`` passes a jit's ``compiler_options`` to the
    backend, which rejects a name it does not know ("No such compile option"). tpu-inference
    compiles its step, model and sampling functions with ``xla_tpu_*`` options (collective
    matmul and SparseCore offload modes) that only the TPU compiler has; some are bound at
    import time (``layers/jax/sample/sampling.py``), so they cannot be removed at their
    source. Off TPU we drop every ``xla_tpu_*`` option; all other options pass through."""
    backend = kwargs.get("backend")
    options = kwargs.get("env_options_overrides")
    if options and getattr(backend, "platform", "tpu") != "tpu":
        kwargs["env_options_overrides"] = {name: value for name, value in options.items()
                                           if not name.startswith("xla_tpu_")}
    return upstream(*args, **kwargs)


def rpa_runs_xla_kernels(upstream, backend, *args, **kwargs):
    """``tpu_inference.layers.common.attention_backend.RPAAttentionBackend.attention`` runs
    the Pallas TPU kernels (ragged paged attention v3). It is the backend every model path
    reaches unless the user registers another: the JAX-native models call
    ``attention_interface.attention`` without a backend (its default is a new
    ``RPAAttentionBackend``), and vLLM's PyTorch models resolve ``--attention-backend``'s
    default to the name ``"rpa"``. Off TPU, where Pallas TPU cannot run, its attention is
    xla-kernels'. Replacing the method (not registering a second name) keeps the selection
    a plain string that a spawned or forked EngineCore rebuilds by itself, so ``vllm serve``
    (which spawns its engine) runs our kernels too."""
    if _jax_has_tpu():
        return upstream(backend, *args, **kwargs)
    from .backend import XlaKernelsAttentionBackend

    return XlaKernelsAttentionBackend().attention(*args, **kwargs)


def rpa_cache_is_xla_kernels(upstream, backend, *args, **kwargs):
    """``RPAAttentionBackend.get_kv_cache_shape`` lays out the KV cache for the Pallas
    kernels, which pad the head axis to their packing. Off TPU the cache is laid out for
    xla-kernels' fused-K/V ops instead (see :func:`rpa_runs_xla_kernels`)."""
    if _jax_has_tpu():
        return upstream(backend, *args, **kwargs)
    from .backend import XlaKernelsAttentionBackend

    return XlaKernelsAttentionBackend().get_kv_cache_shape(*args, **kwargs)


def load_weight_from_a_copy(upstream, layer, param_name, sharding, stage_on_host=False):
    """``tpu_inference.layers.vllm.quantization.unquantized._load_weight_for_layer`` turns a
    torch weight into a JAX array through torchax's ``t2j``, which for a dtype numpy has
    (f32, f16) calls ``tensor.numpy()`` on the weight itself: that makes its storage
    non-resizable, so the caller's ``untyped_storage().resize_(0)`` (freeing the host copy)
    raises "Trying to resize storage that is not resizable" for every f32/f16 checkpoint on
    the PyTorch model path (bf16 passes: t2j converts it to a new f32 tensor first). For a
    plain host tensor of such a dtype we give JAX its own copy (``jnp.array`` of a clone), so
    the weight's storage stays resizable and nothing JAX holds aliases the memory the caller
    frees. Everything else goes to upstream unchanged."""
    import jax.numpy as jnp
    import torch

    tensor = getattr(layer, param_name)
    if (stage_on_host or tensor.device.type != "cpu"
            or tensor.dtype not in (torch.float32, torch.float16)):
        return upstream(layer, param_name, sharding, stage_on_host)
    return jnp.array(tensor.detach().clone().numpy())


def skip_cleanup_without_modules(upstream, model_ref):
    """``vllm.v1.engine.llm_engine.LLMEngine._cleanup_instance_caches`` runs when the engine
    is collected (a ``weakref.finalize``) and walks ``model.modules()`` to drop torch.compile
    hooks. tpu-inference's runner holds no ``torch.nn.Module`` there (a JAX model, or
    ``VllmModelWrapper`` around the torch one), so it raises AttributeError at every
    interpreter exit. A model without ``modules`` has no such hooks: we skip it."""
    model = model_ref()
    if model is None or not hasattr(model, "modules"):
        return None
    return upstream(model_ref)


def copy_host_arrays_on_cpu(upstream, x, *args, **kwargs):
    """``jax.device_put`` of a NumPy array onto a CPU device does not copy it when its data
    is 64-byte aligned: the jax.Array aliases the host buffer (also with
    ``may_alias=False``). tpu-inference's runner builds every step's inputs (token ids,
    positions, sequence lengths, block tables) as views of persistent NumPy buffers and
    hands them to ``device_put`` (``general_device_put``); on a TPU or GPU that is a copy,
    on the CPU an alias, and with vLLM's async scheduling the runner refills those buffers
    for the next step while the previous one may still read them. Which views alias depends
    on the buffers' addresses, so some runs went wrong from the second decode step on. When JAX's
    default backend is the CPU we give ``device_put`` a copy of each NumPy array; other
    inputs and other backends pass through."""
    import jax
    import numpy as np

    if jax.default_backend() == "cpu":
        x = jax.tree.map(lambda a: np.array(a, copy=True) if isinstance(a, np.ndarray) else a,
                         x)
    return upstream(x, *args, **kwargs)


def moe_runs_fused_moe(upstream, *args, **kwargs):
    """``tpu_inference.layers.common.moe.moe_apply`` runs an MoE layer (routing, experts,
    weighted sum) on one of tpu-inference's backends: the GMM kernels, the fused EP kernel or
    megablox, all Pallas TPU kernels. Every MoE layer of both model paths reaches it (the
    JAX-native models through their quant method's ``apply_jax``, vLLM's PyTorch models
    through ``vllm_moe_apply``), each caller having imported it by name, so the same
    replacement is set in each of those modules. Off TPU the layer runs xla-kernels'
    ``fused_moe`` (:func:`xla_kernels.vllm.moe.apply`), or is refused naming what it needs."""
    if _jax_has_tpu():
        return upstream(*args, **kwargs)
    from . import moe

    return moe.apply(upstream, *args, **kwargs)


def moe_weights_stay_in_vllm_layout(upstream, weights, moe_backend, w13_reorder_size=None,
                                    w13_interleave=False, disable_weight_requantization=False):
    """``tpu_inference.layers.common.process_weights.moe_weights.process_moe_weights`` lays
    the experts' weights out for the chosen TPU kernel (for GMM: transposed, the
    intermediate axis padded to 128 and reordered per shard), once at load time. Off TPU
    ``fused_moe`` takes vLLM's own layout, the one this function receives, so the GMM
    backends keep it (:func:`xla_kernels.vllm.moe.keep_vllm_layout`: no per-step
    transpose; under tensor parallel w13's gate and up rows are laid out per shard there,
    once); quantized, biased or expert-parallel experts are refused there, at load time."""
    from . import moe

    if _jax_has_tpu() or moe._backend_name(moe_backend) not in ("gmm_tp", "gmm_ep",
                                                                "fused_moe"):
        return upstream(weights, moe_backend, w13_reorder_size, w13_interleave,
                        disable_weight_requantization)
    return moe.keep_vllm_layout(weights, moe_backend, w13_reorder_size, w13_interleave)


def moe_weights_split_for_fused_moe(upstream, weights, moe_backend, mesh):
    """``tpu_inference.layers.common.process_weights.moe_weights.shard_moe_weights`` places
    the processed weights on the mesh with the PartitionSpecs of upstream's GMM layout
    (w13 [E, H, 2I] split along its last axis, the intermediate one). Our weights stayed in
    vLLM's layout (w13 [E, 2I, H]), where that spec would split the hidden dimension. Off
    TPU the GMM_TP backend's weights are split along the intermediate dimension of our
    layout over the same mesh axis (:func:`xla_kernels.vllm.moe.shard_vllm_layout`). Its
    callers import it by name, so the replacement is set in each of those modules."""
    from . import moe

    if _jax_has_tpu() or moe._backend_name(moe_backend) != "gmm_tp":
        return upstream(weights, moe_backend, mesh)
    return moe.shard_vllm_layout(weights, mesh)


def fp8_fused_runs_fp8_linear(upstream, method, x, weight, weight_scale, bias):
    """``tpu_inference.layers.common.quantization.fp8.Fp8LinearMethod._apply_fused`` runs an
    fp8 linear layer (its fused weight [in, out], e4m3, with its scales) through
    ``sharded_quantized_matmul``: an XLA dot on the fp8 weight after quantizing the
    activations per token (on TPU a Pallas kernel when ``ENABLE_QUANTIZED_MATMUL_KERNEL`` is
    set). Both model paths reach it: vLLM's PyTorch models through
    ``VllmFp8LinearMethod.apply``, the JAX-native ones through their fp8 methods'
    ``apply_jax``. Off TPU the layer runs xla-kernels' ``fp8_linear`` on the weight as
    tpu-inference processed it (:func:`xla_kernels.vllm.fp8.apply_fused`), or is refused
    naming what it needs."""
    if _jax_has_tpu():
        return upstream(method, x, weight, weight_scale, bias)
    from . import fp8

    return fp8.apply_fused(method, x, weight, weight_scale, bias)


def fp8_split_runs_fp8_linear(upstream, method, x, weight_and_scale, bias=None, mesh=None):
    """``Fp8LinearMethod._apply_split``: as :func:`fp8_fused_runs_fp8_linear`, for a layer
    that tpu-inference keeps as one weight per output shard (``fuse_matmuls`` off); off TPU
    one ``fp8_linear`` per weight (:func:`xla_kernels.vllm.fp8.apply_split`)."""
    if _jax_has_tpu():
        return upstream(method, x, weight_and_scale, bias, mesh)
    from . import fp8

    return fp8.apply_split(method, x, weight_and_scale, bias, mesh)


def fp8_weights_stored_out_in(upstream, method, layer):
    """``tpu_inference.layers.vllm.quantization.fp8.VllmFp8LinearMethod
    .process_weights_after_loading`` loads a PyTorch model's fp8 linear weight [out, in],
    transposes it to [in, out] (what TPU's quantized matmul takes) and shards it. Off TPU
    ``fp8_linear`` takes [out, in]: after upstream's processing the weight is transposed back
    once, at load, instead of in every step (:func:`xla_kernels.vllm.fp8.store_weights_out_in`)."""
    upstream(method, layer)
    if _jax_has_tpu():
        return
    from . import fp8

    fp8.store_weights_out_in(method, layer)


def compressed_fp8_runs_fp8_linear(upstream, method, layer, x, bias):
    """``tpu_inference.layers.vllm.quantization.compressed_tensors.schemes
    .compressed_tensors_w8a8_fp8.VllmCompressedTensorsW8A8Fp8._apply_fused`` (and
    ``._apply_split``) run a compressed-tensors fp8 layer (llm-compressor's checkpoints:
    per-channel or per-tensor weight scales) through ``sharded_quantized_matmul``, or an
    XLA dot after a static activation scale. Off TPU the layer runs xla-kernels'
    ``fp8_linear`` (:func:`xla_kernels.vllm.fp8.apply_compressed_tensors`)."""
    if _jax_has_tpu():
        return upstream(method, layer, x, bias)
    from . import fp8

    return fp8.apply_compressed_tensors(method, layer, x, bias)


def compressed_fp8_weights_stored_out_in(upstream, method, layer):
    """``VllmCompressedTensorsW8A8Fp8.process_weights_after_loading`` requantizes a
    per-tensor layer's fused shards to one scale, and leaves the fp8 weight [in, out] (TPU's
    layout). Off TPU a per-tensor layer's scales are first laid out per channel, so the
    checkpoint's values are kept (:func:`xla_kernels.vllm.fp8.per_tensor_scales_per_channel`),
    and the weight is then transposed back to [out, in] once, at load, as for vLLM's
    ``Fp8Config`` checkpoints (:func:`fp8_weights_stored_out_in`)."""
    if _jax_has_tpu():
        return upstream(method, layer)
    from compressed_tensors.quantization import QuantizationStrategy

    from . import fp8

    strategy = method.strategy
    if fp8.per_tensor_scales_per_channel(method, layer):
        method.strategy = QuantizationStrategy.CHANNEL
    try:
        upstream(method, layer)
    finally:
        method.strategy = strategy
    fp8.store_weights_out_in(method, layer)


def jax_fp8_weights_stored_out_in(upstream, *args, **kwargs):
    """``tpu_inference.models.common.model_loader._get_nnx_model`` builds a JAX-native model
    and loads its weights; an fp8 linear layer's weight is loaded [in, out] (what TPU's
    quantized matmul takes). Off TPU ``fp8_linear`` takes [out, in]: once the model is loaded,
    each such weight is transposed once, instead of in every step
    (:func:`xla_kernels.vllm.fp8.store_model_weights_out_in`)."""
    model = upstream(*args, **kwargs)
    if _jax_has_tpu():
        return model
    from . import fp8

    fp8.store_model_weights_out_in(model)
    return model


def fp8_blocks_stay_blocks(upstream, weight, weight_scale, **kwargs):
    """``tpu_inference.layers.common.quantization.fp8.process_blockwise_fp8_linear_weights``
    prepares a block-quantized fp8 weight (a checkpoint with ``weight_block_size``) at load:
    unless ``DISABLE_WEIGHT_REQUANTIZATION`` is set, it dequantizes each weight to bf16 and
    quantizes it again for the TPU's matmul (one scale per output column, or
    ``REQUANTIZE_BLOCK_SIZE`` blocks), so the layer no longer computes with the checkpoint's
    numbers. ``fp8_linear`` takes 128 x 128 block scales as they are, so off TPU the
    checkpoint's weight and block scales are kept, laid out per shard as upstream's
    unrequantized path does (:func:`xla_kernels.vllm.fp8.keep_weight_blocks`)."""
    if _jax_has_tpu():
        return upstream(weight, weight_scale, **kwargs)
    from . import fp8

    return fp8.keep_weight_blocks(weight, weight_scale, **kwargs)


def sampling_runs_xla_kernels(upstream, runner, *args, **kwargs):
    """``tpu_inference.runner.tpu_runner.TPUModelRunner._sample_from_logits`` samples a
    step's logits through tpu-inference's ``sample`` (temperature, top-k, top-p only: the
    request's penalties, ``min_p``, ``logit_bias``, ``bad_words``, ``min_tokens``,
    ``allowed_token_ids`` and ``seed`` are dropped). Off TPU, when the step samples or a
    request asks for one of those, we build :func:`xla_kernels.vllm.sampling.step_metadata`
    and pass it on in place of upstream's metadata; :func:`sample_runs_xla_kernels` then
    applies it. A request that reads its own tokens (penalties, bad words, min tokens)
    needs the previous step's token, which under async scheduling is still in flight: we
    fetch it first, as upstream does at the start of a step that schedules nothing
    (``_modify_prev_results``). Steps with speculative decoding stay upstream's (those
    parameters are refused at request time there)."""
    from . import sampling

    call = inspect.signature(upstream).bind(runner, *args, **kwargs)
    call.apply_defaults()
    a = call.arguments
    if _jax_has_tpu() or a["spec_decode_metadata"] is not None:
        return upstream(*call.args, **call.kwargs)
    ids = [i for i in runner.input_batch.req_ids[:runner.input_batch.num_reqs] if i]
    params = [runner.requests[i].sampling_params for i in ids]
    if not (a["tpu_sampling_metadata"].do_sampling
            or any(map(sampling.needs_processing, params))):
        return upstream(*call.args, **call.kwargs)
    if (any(map(sampling.needs_history, params)) and runner.scheduler_config.async_scheduling
            and runner._pre_async_results is not None):
        runner._modify_prev_results()
        runner._pre_async_results = None
    padded = a["padded_num_reqs"]
    if padded is None:
        from tpu_inference.runner import utils as runner_utils

        padded = runner_utils.get_padded_num_reqs_with_upper_limit(
            runner.input_batch.num_reqs, runner.max_num_reqs)
    a["tpu_sampling_metadata"] = sampling.step_metadata(runner, a["tpu_sampling_metadata"],
                                                        padded, a["req_ids_dp"])
    return upstream(*call.args, **call.kwargs)


def sample_runs_xla_kernels(upstream, rng, mesh, logits, tpu_sampling_metadata,
                            allow_distributed_sampling=True):
    """``tpu_inference.layers.jax.sample.sampling.sample`` (as the runner imported it,
    ``tpu_runner.sample``) draws with ``jax.random.categorical`` after temperature, top-k and
    top-p. Given our metadata (:func:`sampling_runs_xla_kernels`), the row's logits
    processors run on the device and xla-kernels' ``sample`` op draws
    (:func:`xla_kernels.vllm.sampling.sample`); upstream's metadata goes to upstream."""
    from . import sampling

    if not isinstance(tpu_sampling_metadata, sampling.metadata_class()):
        return upstream(rng, mesh, logits, tpu_sampling_metadata,
                        allow_distributed_sampling=allow_distributed_sampling)
    return sampling.sample(rng, mesh, logits, tpu_sampling_metadata)


def allowed_token_ids_kept_from_input_batch(upstream, batch, request, *args, **kwargs):
    """``tpu_inference.runner.input_batch.InputBatch.add_request`` records a request's
    ``allowed_token_ids`` in a mask it allocates with ``jnp.zeros(max_num_reqs, vocab_size,
    dtype=...)`` (TypeError: the shape passed as two arguments) and clears with torch's
    ``fill_`` on a NumPy array; nothing reads the mask. :mod:`xla_kernels.vllm.sampling`
    reads ``allowed_token_ids`` from the request's parameters instead, so upstream is shown
    the request without them (and restored after)."""
    params = getattr(request, "sampling_params", None)
    allowed = getattr(params, "allowed_token_ids", None)
    if not allowed:
        return upstream(batch, request, *args, **kwargs)
    params.allowed_token_ids = None
    try:
        return upstream(batch, request, *args, **kwargs)
    finally:
        params.allowed_token_ids = allowed


SHARD_MOE_WEIGHTS_SHA256 = "2f2ee73b962c1d081efb5559ed79599b32cc3621d34c05996f34788be24240a7"
SHARD_MOE_WEIGHTS_CALLERS = (
    "tpu_inference.layers.common.process_weights.moe_weights",
    "tpu_inference.layers.vllm.quantization.unquantized",
    "tpu_inference.layers.jax.quantization.unquantized",
)
"""The modules that hold ``shard_moe_weights`` for unquantized experts (quantized ones are
refused at processing, before they are placed)."""


MOE_APPLY_SHA256 = "c6959bf244e411c77c0f539a4e4eb76786ee53a01cff6be0890e37a4bb6e1d78"
MOE_APPLY_CALLERS = (
    "tpu_inference.layers.common.moe",
    "tpu_inference.layers.vllm.interface.moe",
    "tpu_inference.layers.jax.quantization.unquantized",
    "tpu_inference.layers.jax.quantization.fp8",
    "tpu_inference.layers.jax.quantization.mxfp4",
)
"""The modules that hold ``moe_apply`` under that name (its own and those importing it)."""


COMPRESSED_FP8 = ("tpu_inference.layers.vllm.quantization.compressed_tensors.schemes."
                  "compressed_tensors_w8a8_fp8:VllmCompressedTensorsW8A8Fp8")
"""tpu-inference's scheme for compressed-tensors fp8 linear layers (vLLM's PyTorch models)."""


PATCHES: list[Patch] = [
    Patch("tpu_inference.runner.tpu_runner:TPUModelRunner", "_create_2d_mesh",
          "d28c4fca3f35f88a98d34770a2c3e059bd11991dd29d52ddc7f20a5a30403e8b", plain_2d_mesh,
          kind="method"),
    Patch("tpu_inference.utils", "get_device_hbm_limit",
          "66a55e6261fb7ff3a9990ba020551b3d45bcc3878bd8577b0a1bdfb5a8e0b85c", device_memory_limit),
    Patch("tpu_inference.layers.common.attention_backend:RPAAttentionBackend", "attention",
          "69c567487ac6944c52ae070d4ee72007fda5ff67fd0c09092230e272ceceb7b7",
          rpa_runs_xla_kernels, kind="method"),
    Patch("tpu_inference.layers.common.attention_backend:RPAAttentionBackend",
          "get_kv_cache_shape",
          "fd0e6a0ba5752a054309dab90629ddbfc1742a4267816e5b23e1d7b903915595",
          rpa_cache_is_xla_kernels, kind="method"),
    Patch("tpu_inference.layers.vllm.quantization.unquantized", "_load_weight_for_layer",
          "18c3126af4314d5a074f7150a1ed287b323bb36eda8f00f5df54cc56be61fb6c",
          load_weight_from_a_copy),
    Patch("vllm.v1.engine.llm_engine:LLMEngine", "_cleanup_instance_caches",
          "72d88aa5fd4627b2906c70284319c631a0d755bbbbf2fd7753464fdb20a2f6ae",
          skip_cleanup_without_modules, kind="staticmethod"),
    Patch("jax", "device_put", "aa968c7ca96d361c6bc95b2d67f9641a21b8569746748f951ce27a12e261f126",
          copy_host_arrays_on_cpu),
    Patch("jax._src.compiler", "get_compile_options",
          "a648a14b9de52eae5dd4873430a686a328888599152630ecb6ec65b74fd0ea94",
          drop_tpu_compile_options),
    Patch("tpu_inference.layers.common.process_weights.moe_weights", "process_moe_weights",
          "e4262431f8e606cca8f9207ee214ca72f8215cca4fbcd4ccbdc98f3659413a6a",
          moe_weights_stay_in_vllm_layout),
    Patch("tpu_inference.layers.common.quantization.fp8:Fp8LinearMethod", "_apply_fused",
          "76244780c84acf7c4300dddbf905223825ce330724b6efadb131bc843ccd3ed1",
          fp8_fused_runs_fp8_linear, kind="method"),
    Patch("tpu_inference.layers.common.quantization.fp8:Fp8LinearMethod", "_apply_split",
          "7540f88928099d2a40c65f5cf84fb359c8614f031f931f26760bced759c2fa47",
          fp8_split_runs_fp8_linear, kind="method"),
    Patch("tpu_inference.layers.vllm.quantization.fp8:VllmFp8LinearMethod",
          "process_weights_after_loading",
          "954f1bc421714f814368f3002b28ee7b51010b0aae7ea55ba33a7ce0883f5897",
          fp8_weights_stored_out_in, kind="method"),
    Patch(COMPRESSED_FP8, "_apply_fused",
          "b27ea45ffab7c00450e409717a1afc2a72190f206a2245a3298a3faf39f79575",
          compressed_fp8_runs_fp8_linear, kind="method"),
    Patch(COMPRESSED_FP8, "_apply_split",
          "0f3c0d9e7a01ceefd3b4babf7ce8a6ada24125aa2d6ec9805be8ab5d9e80d22d",
          compressed_fp8_runs_fp8_linear, kind="method"),
    Patch(COMPRESSED_FP8, "process_weights_after_loading",
          "70a4c898c2ae0aed50e96da4e5394592a43e5b9625e19930d085a105e2ede8e9",
          compressed_fp8_weights_stored_out_in, kind="method"),
    Patch("tpu_inference.models.common.model_loader", "_get_nnx_model",
          "ded844630dbd51d3f68610957f8731414db51f5f9d1d2b326a1b97c1ad64292d",
          jax_fp8_weights_stored_out_in),
    Patch("tpu_inference.layers.common.quantization.fp8",
          "process_blockwise_fp8_linear_weights",
          "ebae0307fe28d898f21644ba2e09e87f101f2392933f764f9add4752143b8420",
          fp8_blocks_stay_blocks),
    Patch("tpu_inference.runner.tpu_runner:TPUModelRunner", "_sample_from_logits",
          "a05399afda09a6267e770a69c53409fbf47b0f9e61b45134ea348ad29ea4422b",
          sampling_runs_xla_kernels, kind="method"),
    Patch("tpu_inference.runner.tpu_runner", "sample",
          "612b317f728893d7322905ae4dfadc504922108d68f26160f25ba4ab4cacb439",
          sample_runs_xla_kernels),
    Patch("tpu_inference.runner.input_batch:InputBatch", "add_request",
          "5599bb486cd7c0f8d8bcf5401e383cfbc0c2fda00bb7344f92d369e5ea0c4ff7",
          allowed_token_ids_kept_from_input_batch, kind="method"),
    *(Patch(module, "moe_apply", MOE_APPLY_SHA256, moe_runs_fused_moe)
      for module in MOE_APPLY_CALLERS),
    *(Patch(module, "shard_moe_weights", SHARD_MOE_WEIGHTS_SHA256,
            moe_weights_split_for_fused_moe) for module in SHARD_MOE_WEIGHTS_CALLERS),
]


def apply_all() -> None:
    """Apply every patch (idempotent); raises :class:`PatchDriftError` on the first function
    that is not the pinned one, before changing anything."""
    for patch in PATCHES:
        patch.check()
    for patch in PATCHES:
        patch.apply()

"""The vLLM platform that runs tpu-inference's JAX runner where JAX has no TPU.

vLLM asks every ``vllm.platform_plugins`` entry point which platform to run, and one
out-of-tree answer wins over its built-in detection. :func:`detect` answers
:class:`XlaKernelsPlatform` unless the machine has a TPU (then tpu-inference's own platform
runs, untouched) or ``XLA_KERNELS_VLLM=0``. The platform is tpu-inference's ``TpuPlatform``
(the same runner, model loaders and JAX/torchax model paths) with two changes: the patches in
:mod:`xla_kernels.vllm.patches` are applied (TPU-only assumptions, and the default attention
backend runs xla-kernels' ops), and a page size that our ops cannot split is refused early.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from xla_kernels import env

ENV = "XLA_KERNELS_VLLM"
"""``0`` keeps vLLM's own platform detection; ``1`` selects ours even where a TPU is seen."""


def tpu_present() -> bool:
    """Whether this host has TPU chips (the device files libtpu opens), or JAX is told to
    use one."""
    platforms = env.get("JAX_PLATFORMS") or ""
    if platforms:
        return "tpu" in platforms.split(",")
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def active() -> bool:
    """Whether vLLM should run on :class:`XlaKernelsPlatform`."""
    choice = env.get(ENV) or ""
    if choice in ("0", "1"):
        return choice == "1"
    return not tpu_present()


ASYNC_DISPATCH = "PJRT_GPU_ENABLE_ASYNC_DISPATCH"
"""The PjRt GPU client's asynchronous dispatch (a jitted call returns before its work is
launched), read once when JAX creates its GPU client."""


PLUGIN_GROUP = "vllm.platform_plugins"
PLUGIN_TARGET = f"{__name__}:detect"
"""The entry point (in xla-kernels' installed metadata) through which vLLM finds us."""

_log = logging.getLogger(__name__)


def plugin_installed() -> bool:
    """Whether an installed distribution declares our ``vllm.platform_plugins`` entry
    point, the only way vLLM finds this platform (a package that is importable, e.g. from
    ``PYTHONPATH``, but not installed has no entry points)."""
    from importlib.metadata import entry_points

    return any(e.value == PLUGIN_TARGET for e in entry_points(group=PLUGIN_GROUP))


def plugin_problem() -> str | None:
    """None when vLLM will find this platform; else what is wrong and the fix."""
    if plugin_installed():
        return None
    package = Path(__file__).resolve().parents[1]
    source = package.parent
    install = (f"pip install --no-deps --no-build-isolation -e {source.parent}"
               if (source.parent / "pyproject.toml").is_file() else "pip install xla-kernels")
    return ("vLLM will not find xla-kernels' platform: xla_kernels is imported from "
            f"{package}, but no installed distribution declares its {PLUGIN_GROUP} entry "
            "point, so vLLM picks one of its own platforms (on an NVIDIA GPU it then fails "
            "with \"No module named 'vllm._C_stable_libtorch'\"). Fix: install the package "
            f"({install}); or, for vllm.LLM in this process, call "
            "xla_kernels.vllm.activate() before creating it")


def detect() -> str | None:
    """``vllm.platform_plugins`` entry point: our platform's qualified name, or None.

    Selecting it also sets two defaults (a value the user set is kept):

    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine in the caller's process): a forked
      EngineCore hung after its precompilation on the CPU (JAX's threads were already
      running when vLLM forked). Set it to 1 to try anyway.
    - ``PJRT_GPU_ENABLE_ASYNC_DISPATCH=1``: vLLM schedules asynchronously, so the host
      prepares step N + 1 while the device runs step N, but a synchronous dispatch blocks
      the host until each program's launch is done, which over several GPUs (one launch per
      device) outlasted the GPUs' work (docs/vllm.md, tensor parallel). vLLM picks the
      platform before anything creates JAX's GPU client, which reads it; a spawned engine
      inherits it. The CPU client does not read it."""
    if not active():
        if not env.get(ENV) and glob.glob("/dev/nvidia[0-9]*"):
            _log.warning("xla-kernels: TPU device files are present (or JAX_PLATFORMS names "
                         "tpu), so vLLM runs its TPU platform, not xla-kernels' on this "
                         "machine's NVIDIA GPU. Fix: set %s=1 to select xla-kernels'", ENV)
        return None
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault(ASYNC_DISPATCH, "1")
    return f"{__name__}.XlaKernelsPlatform"


CACHE_THRESHOLDS = {"jax_persistent_cache_min_compile_time_secs": 0.0,
                    "jax_persistent_cache_min_entry_size_bytes": -1}
"""JAX's persistent-cache thresholds this platform lowers (JAX's defaults: programs that
compile in under 1 s are not written). tpu-inference turns the cache on
(``VLLM_XLA_CACHE_PATH``, default ``~/.cache/vllm/xla_cache``) and precompiles ~40 programs
for even a tiny model, most under a second: with every program cached, a second start of
the tiny Llama on an H200 took 18.6 s against 26.2 s with the defaults (first start
43.9 s; docs/vllm.md, start-up)."""


def cache_every_program() -> None:
    """Lowers :data:`CACHE_THRESHOLDS` unless the user set them (``JAX_*`` variables)."""
    import jax

    for name, value in CACHE_THRESHOLDS.items():
        if name.upper() not in os.environ:
            jax.config.update(name, value)


_registered = False


def activate() -> None:
    """Selects :class:`XlaKernelsPlatform` in this process and applies the patches: what
    vLLM's plugin loading does when xla-kernels is installed, for a process that imports it
    without installing it (``PYTHONPATH``). Call it before creating ``vllm.LLM`` (the
    engine must run in this process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the default this
    platform sets); ``vllm serve`` and spawned engines need the package installed."""
    import vllm.platforms as platforms

    qualname = detect()
    if qualname is None:
        raise RuntimeError(f"xla_kernels.vllm.activate(): not on a TPU host or with {ENV}=0 "
                           f"({ENV}={env.get(ENV)!r}, TPU present: {tpu_present()}). Fix: "
                           f"unset {ENV} (or set it to 1) to run xla-kernels' platform")
    current = platforms._current_platform
    if current is not None and type(current).__name__ != "XlaKernelsPlatform":
        raise RuntimeError(f"xla_kernels.vllm.activate(): vLLM already selected "
                           f"{type(current).__name__} in this process. Fix: call activate() "
                           "before anything creates a vLLM engine or config")
    if current is None:
        platforms._current_platform = __getattr__("XlaKernelsPlatform")()
    register()


def register() -> None:
    """``vllm.general_plugins`` entry point (``xla_kernels.vllm:register``): applies
    :mod:`xla_kernels.vllm.patches`. vLLM runs it in every process it starts (the API
    server, a spawned EngineCore, workers), and may run it more than once per process."""
    global _registered
    if _registered or not active():
        return
    from . import patches

    patches.apply_all()
    _registered = True


SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "dflash", "dspark")
"""The ``speculative_config`` methods tpu-inference's runner has a proposer for
(``TPUModelRunner._init_speculative_decoding``: n-gram, and its EAGLE-3 and DFlash proposers
for vLLM's ``use_eagle()`` methods); any other stops the engine at start-up with
``NotImplementedError``. Of these only ``ngram`` is tested on this backend."""


def _jax_native(vllm_config) -> bool:
    """Whether tpu-inference will run the model on its JAX-native path (``flax_nnx``): what
    ``MODEL_IMPL_TYPE`` (default ``auto``) resolves to for the architecture, which must then
    have a JAX model (otherwise tpu-inference falls back to the PyTorch path)."""
    from tpu_inference.models.common import model_loader

    if model_loader.resolve_model_impl_type(vllm_config) != "flax_nnx":
        return False
    try:
        model_loader._get_model_architecture(vllm_config.model_config.hf_config)
    except model_loader.UnsupportedArchitectureError:
        return False
    return True


def _fp8_scales(vllm_config) -> str | None:
    """How the checkpoint's fp8 weights are scaled (``"tensor"``, ``"channel"``,
    ``"block"``): vLLM's ``Fp8Config`` (``quant_method: "fp8"``) or compressed-tensors with
    8-bit float weights; None for any other checkpoint."""
    config = getattr(vllm_config.model_config.hf_config, "quantization_config", None)
    if not isinstance(config, dict):
        return None
    if config.get("quant_method") == "fp8":
        return "block" if config.get("weight_block_size") else "tensor"
    if config.get("quant_method") == "compressed-tensors":
        for group in (config.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            if weights.get("type") == "float" and weights.get("num_bits") == 8:
                return str(weights.get("strategy") or "tensor")
    return None


def _fp8_refusal(vllm_config) -> str | None:
    """config_refusal's part for fp8 checkpoints (see there)."""
    scales = _fp8_scales(vllm_config)
    if scales is None:
        return None
    load_format = vllm_config.load_config.load_format
    if getattr(load_format, "value", load_format) == "dummy":
        return ("xla_kernels.vllm: dummy weights (load_format='dummy') for an fp8 checkpoint's "
                "configuration are not supported on this backend: the PyTorch path's dummy "
                "loader cannot fill e4m3 parameters (torch's uniform_ is not implemented for "
                "Float8_e4m3fn), tpu-inference's JAX-native Llama would build the model in "
                "bf16 without its fp8 layers, and its other JAX-native models draw weights "
                "that are not e4m3fn. Fix: load the checkpoint's weights "
                "(xla_kernels.vllm.models.fp8_weights writes an fp8 checkpoint of a bf16 "
                "model), or drop quantization_config from config.json for a bf16 dummy run")
    if not _jax_native(vllm_config):
        return None
    from tpu_inference import envs
    from tpu_inference.models.common import model_loader
    from tpu_inference.models.jax.utils.weight_utils import LoadableWithIterator

    hf_config = vllm_config.model_config.hf_config
    arch = hf_config.architectures[0]
    where = (f"tpu-inference's JAX-native model path (MODEL_IMPL_TYPE={envs.MODEL_IMPL_TYPE} "
             f"runs {arch} there)")
    if not issubclass(model_loader._get_model_architecture(hf_config), LoadableWithIterator):
        return (f"xla_kernels.vllm: an fp8 checkpoint is not supported on {where}: its "
                f"{arch} reads safetensors through NumPy, which has no e4m3 dtype "
                "(AttributeError at load). Fix: set MODEL_IMPL_TYPE=vllm (the PyTorch path "
                "runs fp8 checkpoints through fp8_linear)")
    if scales == "tensor":
        return (f"xla_kernels.vllm: per-tensor fp8 scales are not supported on {where}: its "
                "fp8 layers take one scale per output channel (RuntimeError at load). Fix: "
                "set MODEL_IMPL_TYPE=vllm, or use a checkpoint with 128x128 block or "
                "per-channel scales")
    return None


def config_refusal(vllm_config) -> str | None:
    """The message refusing an engine configuration this backend cannot run, naming the
    feature, why, and the fix; None when it can. :class:`XlaKernelsPlatform` raises it from
    ``check_and_update_config``, before anything is loaded.

    - ``watermark_config``: only vLLM's CUDA model runner applies watermarks.
    - LoRA (``enable_lora``) on the JAX-native model path: only the PyTorch path (torchax)
      has LoRA layers; the engine would stop at start-up ("AssertionError: LoRA is not
      enabled").
    - a ``speculative_config`` method outside :data:`SPECULATIVE_METHODS`.
    - fp8 checkpoints (vLLM's ``Fp8Config``, compressed-tensors fp8) where upstream cannot
      load them: with dummy weights (the PyTorch path's loader fails on e4m3 parameters; the
      JAX-native Llama silently drops the fp8 layers; the other JAX-native models draw
      weights our fp8 layers refuse), on a JAX-native model that reads safetensors through
      NumPy (no e4m3: Llama), and with per-tensor scales on the JAX-native path (its layers
      take per-channel scales)."""
    if getattr(vllm_config, "watermark_config", None) is not None:
        return ("xla_kernels.vllm: watermark_config (and so SamplingParams watermarking) is "
                "not supported on this backend: only vLLM's CUDA model runner applies "
                "watermarks, tpu-inference's runner would ignore it. Fix: run without a "
                "watermark_config")
    if vllm_config.lora_config is not None and _jax_native(vllm_config):
        from tpu_inference import envs

        arch = vllm_config.model_config.hf_config.architectures[0]
        return ("xla_kernels.vllm: LoRA (enable_lora=True) is not supported on "
                "tpu-inference's JAX-native model path (MODEL_IMPL_TYPE="
                f"{envs.MODEL_IMPL_TYPE} runs {arch} there): only its "
                "PyTorch path (torchax) has LoRA layers, and the engine would stop at "
                "start-up with 'AssertionError: LoRA is not enabled'. Fix: set "
                "MODEL_IMPL_TYPE=vllm (LoRA adapters work on that path), or run without "
                "enable_lora")
    speculative = vllm_config.speculative_config
    if speculative is not None and speculative.method not in SPECULATIVE_METHODS:
        return (f"xla_kernels.vllm: speculative_config method {speculative.method!r} is not "
                "supported on this backend: tpu-inference's model runner has proposers "
                f"for {', '.join(SPECULATIVE_METHODS)} only, and would stop at start-up with "
                "NotImplementedError. Fix: use method 'ngram' (tested here), or run without "
                "speculative_config")
    return _fp8_refusal(vllm_config)


def _platform_class():
    from tpu_inference.platforms.tpu_platform import TpuPlatform

    class XlaKernelsPlatform(TpuPlatform):
        """tpu-inference's platform, running xla-kernels' attention on JAX's CPU or GPU."""

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            import jax

            return f"xla-kernels on {jax.devices()[device_id].device_kind}"

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            message = config_refusal(vllm_config)
            if message:
                raise ValueError(message)
            register()
            cache_every_program()
            super().check_and_update_config(vllm_config)
            from .attention import sub_block_size

            sub_block_size(vllm_config.cache_config.block_size)
            cls.speculative = vllm_config.speculative_config is not None

        speculative = False
        """Whether the engine this process configured runs speculative decoding (set by
        :meth:`check_and_update_config`, which vLLM runs in the process that validates
        requests too)."""

        @classmethod
        def validate_request(cls, processed_inputs, params) -> None:
            """Refuses a request whose ``SamplingParams`` ask for what this backend does not
            do, naming the parameters (:func:`xla_kernels.vllm.sampling.refusal`).
            Unlike tpu-inference's platform, a per-request ``seed`` is taken: xla-kernels'
            ``sample`` op draws with it."""
            from vllm.sampling_params import SamplingParams

            if isinstance(params, SamplingParams):
                from .sampling import refusal

                message = refusal(params, speculative=cls.speculative)
                if message:
                    raise ValueError(message)

    XlaKernelsPlatform.__module__ = __name__
    return XlaKernelsPlatform


def __getattr__(name: str):
    # The class is built on first use: importing this module for `detect` must not import
    # tpu-inference (vLLM runs the detection of every plugin at start-up).
    if name == "XlaKernelsPlatform":
        cls = _platform_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

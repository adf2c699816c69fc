"""fp8_linear in plain XLA (the fallback where no kernel runs and the peers the benchmark
times) and in float64 NumPy (:func:`fp8_linear_numpy_f64`, the tests' reference, sharing no
code with the rest). Both follow the op's semantics (see the package docstring).

* ``"none"``: the weight dequantized (to f32, then to x's dtype), one dot with f32 results:
  "dequantize + bf16 dot" for bf16 x.
* ``"dynamic"``: x quantized per token (:func:`quantize_activations`), then
  ``jax.lax.dot_general`` on the two float8 arrays with f32 results, then the scales: the
  fp8 dot XLA:GPU lowers to cuBLASLt. Block scales vary along ``in``, so the dot runs per
  block of bk columns (a batch dimension) and the f32 partial products are scaled and added.

Example:
    >>> import numpy as np
    >>> from xla_kernels.kernels.fp8_weights import fp8_quantize
    >>> w, s = fp8_quantize(np.ones((6, 32), np.float32), (4, 16))
    >>> fp8_linear_xla(np.ones((3, 32), np.float32), w, s, block_shape=(4, 16)).shape
    (3, 6)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from xla_kernels.kernels.fp8_weights import E4M3_MAX, dequantize

SCHEMES = ("none", "dynamic")


def quantize_activations(x: Any) -> tuple[Any, Any]:
    """(q e4m3 [tokens, in], s f32 [tokens, 1]) with ``x ~ q * s``: per row ``s = max(amax,
    1e-12) * f32(1 / 448)`` and ``q = e4m3(x / s)`` (f32, round to nearest even,
    saturated)."""
    x = jnp.asarray(x).astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    s = jnp.maximum(amax, jnp.float32(1e-12)) * (jnp.float32(1) / jnp.float32(E4M3_MAX))
    q = jnp.clip(x / s, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
    return q, s


def _blocked_fp8_dot(q: Any, weight: Any, scale: Any, block_shape: tuple[int, int]) -> Any:
    """sum over in of q * weight * scale in f32 [tokens, out], fp8 dots per column block."""
    bn, bk = block_shape
    tokens, k = q.shape
    out = weight.shape[0]
    kb = -(-k // bk)
    pad = kb * bk - k
    qb = jnp.pad(q, ((0, 0), (0, pad))).reshape(tokens, kb, bk)
    wb = jnp.pad(weight, ((0, 0), (0, pad))).reshape(out, kb, bk)
    part = jax.lax.dot_general(qb, wb, (((2,), (2,)), ((1,), (1,))),
                               preferred_element_type=jnp.float32)  # [kb, tokens, out]
    per_row = jnp.repeat(jnp.asarray(scale, jnp.float32), bn, axis=0)[:out]  # [out, kb]
    return jnp.einsum("ktn,nk->tn", part, per_row)


def fp8_linear_xla(x: Any, weight: Any, weight_scale: Any, *,
                   block_shape: tuple[int, int] = (0, 0), activation_scheme: str = "none"
                   ) -> Any:
    """The op in plain XLA (same arguments, same result up to rounding)."""
    x = jnp.asarray(x)
    bn, bk = (int(b) for b in block_shape)
    if activation_scheme == "none":
        w = dequantize(weight, weight_scale, (bn, bk)).astype(x.dtype)
        y = jnp.dot(x, w.T, preferred_element_type=jnp.float32)
        return y.astype(x.dtype)
    if activation_scheme != "dynamic":
        raise ValueError(f"unknown activation_scheme {activation_scheme!r}; use one of "
                         f"{SCHEMES}")
    q, s = quantize_activations(x)
    weight = jnp.asarray(weight)
    if bn == 0:
        acc = jax.lax.dot_general(q, weight, (((1,), (1,)), ((), ())),
                                  preferred_element_type=jnp.float32)
        y = acc * jnp.asarray(weight_scale, jnp.float32)[:, 0][None, :]
    else:
        y = _blocked_fp8_dot(q, weight, weight_scale, (bn, bk))
    return (y * s).astype(x.dtype)


# The float64 reference: NumPy and ml_dtypes only, written from the semantics apart from
# the JAX code above.

def dequantize_f64(q: Any, scale: Any, block_shape: tuple[int, int]) -> np.ndarray:
    """The weight [out, in]: each e4m3 value times its own scale."""
    q = np.asarray(q).astype(np.float64)
    scale = np.asarray(scale, np.float64)
    bn, bk = block_shape
    r = np.arange(q.shape[0])[:, None]
    c = np.arange(q.shape[1])[None, :]
    if bn == 0:
        return q * scale[r, 0]
    return q * scale[r // bn, c // bk]


def quantize_rows_f32(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 values as float64 [tokens, in], scales float64 [tokens, 1]): per row, in f32,
    s = max(amax, 1e-12) * f32(1 / 448) and q = e4m3(clip(x / s, -448, 448)) rounded to
    nearest even."""
    x = np.asarray(x).astype(np.float32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    s = (np.maximum(amax, np.float32(1e-12)) * np.float32(1 / 448)).astype(np.float32)
    q = np.clip(x / s, np.float32(-448), np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float64), s.astype(np.float64)


def fp8_linear_numpy_f64(x: Any, weight: Any, scale: Any, *,
                         block_shape: tuple[int, int] = (0, 0),
                         activation_scheme: str = "none") -> np.ndarray:
    """y [tokens, out] in float64 NumPy: the weight decoded by ml_dtypes and scaled element
    by element; for "dynamic" x quantized exactly as documented (NumPy f32), then float64."""
    w = dequantize_f64(weight, scale, block_shape)
    if activation_scheme == "none":
        return np.asarray(x).astype(np.float64) @ w.T
    q, s = quantize_rows_f32(x)
    return s * (q @ w.T)

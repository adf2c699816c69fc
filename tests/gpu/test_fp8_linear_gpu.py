"""fp8_linear's CUDA kernel against the float64 oracle (tests/fp8_linear_oracle.py): both
activation schemes, per-channel and block scales, bf16/f16/f32; Llama-3-8B decode shapes
(16-byte loads, one block scale per load), odd sizes (byte loads, partial CTAs and blocks,
blocks narrower than a load), several token tiles; agreement with the CPU kernel; the
plain-XLA fp8 dot the benchmark times; torch eager on CUDA with NaN left in the allocator
where the output lands; the compute-sanitizer cases."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8_linear_oracle import TOL, fp8_linear_f64, make_inputs, rel
from xla_kernels.kernels.fp8_linear import fp8_linear, fp8_linear_xla
from xla_kernels.kernels.fp8_linear.testing import sanitize_cases

pytestmark = pytest.mark.gpu

# (tokens, in, out, block_shape)
SHAPES = {
    "llama qkv decode": (1, 4096, 6144, (128, 128)),
    "llama down decode per channel": (4, 14336, 4096, (0, 0)),
    "two token tiles and a partial one": (19, 512, 256, (128, 128)),
    "64 tokens": (64, 1024, 384, (0, 0)),
    "byte loads, partial CTA": (3, 29, 13, (0, 0)),
    "blocks narrower than a load": (9, 96, 40, (8, 8)),
    "partial 128x128 blocks": (5, 200, 136, (128, 128)),
    "many token tiles": (300, 256, 48, (16, 32)),
    # The tensor-core path (bf16/f16 x, in a multiple of 128): token tiles of 32 (block
    # scales) and 64 (channel), partial ones, rows past out, several K splits.
    "tensor cores: token tiles, partial rows": (300, 1024, 200, (128, 128)),
    "tensor cores: channel scales, 130 tokens": (130, 512, 136, (0, 0)),
    "tensor cores: 13 rows": (5, 256, 13, (0, 0)),
    "tensor cores: 256 tokens, many splits": (256, 4096, 256, (128, 128)),
    # The skinny GEMM (up to 16 tokens, per-channel scales, bf16/f16 x): a cluster split, a
    # partial last chunk and rows past out, 16 tokens.
    "skinny: llama o decode": (1, 4096, 4096, (0, 0)),
    "skinny: partial chunk and rows": (7, 1040, 72, (0, 0)),
    "skinny: 16 tokens": (16, 2048, 520, (0, 0)),
    # The Hopper path (compute capability 9.0, bf16 x, per-channel scales, no activation
    # scheme): each of its three tiles, partial tiles in both axes, and an in that CUTLASS
    # does not take (not a multiple of 16), which falls back.
    "hopper: llama down, 32 tokens": (32, 14336, 4096, (0, 0)),
    "hopper: 33 tokens, a partial row tile": (33, 1024, 200, (0, 0)),
    "hopper: 129 tokens, the large tile": (129, 512, 264, (0, 0)),
    "hopper: in 40 falls back": (5, 40, 64, (0, 0)),
    # Up to 128 tokens and in >= 8192 the stream-K scheduler (CUTLASS's heuristic
    # decomposition): down at 16 and 64 tokens (stream-K units or split-K across every SM),
    # 9 tokens padded to the 16-token tile (the op's workspace is sized for tokens padded to
    # 64); o (in 4096) runs the ping-pong tile.
    "hopper stream-K: llama down, 64 tokens": (64, 14336, 4096, (0, 0)),
    "hopper stream-K: llama down, 16 tokens": (16, 14336, 4096, (0, 0)),
    "hopper stream-K: 9 tokens, padded to the 16-token tile": (9, 8192, 4096, (0, 0)),
    "hopper ping-pong: llama o, 64 tokens": (64, 4096, 4096, (0, 0)),
    "hopper: 17 tokens, in 8192 with 300 rows": (17, 8192, 300, (0, 0)),
    # 65-128 tokens: one 128-token tile where its tiles fill at least half the SMs (8448
    # rows: 66 tiles of 128 for W8A16, 132 of 64 for W8A8 on 132 SMs), else two 64-token ones.
    "hopper: 96 tokens, the wide tile": (96, 1024, 8448, (0, 0)),
    "hopper: 96 tokens, 1024 rows: two narrow tiles": (96, 1024, 1024, (0, 0)),
    # W8A8 ("dynamic") with 128 x 128 block scales on the Hopper path (CUTLASS's blockwise
    # mainloop): a partial 64-row scale group (200 rows), 40 tokens (scales padded to 40).
    "hopper block W8A8: 40 tokens, 200 rows": (40, 1024, 200, (128, 128)),
    # Token counts that are not multiples of 4 on the 64- and 128-token tiles (x's scales
    # padded to 4 tokens with zeros).
    "hopper block W8A8: 21 tokens": (21, 1024, 256, (128, 128)),
    "hopper block W8A8: 70 tokens": (70, 512, 264, (128, 128)),
    # W8A8 beyond 128 tokens: the cooperative 128 x 128 tile where its tiles fill the SMs
    # (4200 rows: 33 row tiles, the last partial, x 2 token tiles = 66 on 132 SMs), partial in
    # both axes; at 264 rows (6 tiles) the 64-row ping-pong tile.
    "hopper W8A8 cooperative: 160 tokens, 4200 rows": (160, 512, 4200, (0, 0)),
    "hopper block W8A8 cooperative: 160 tokens, 4200 rows": (160, 512, 4200, (128, 128)),
    "hopper block W8A8: 160 tokens, 264 rows": (160, 512, 264, (128, 128)),
}


def gpu(*arrays):
    return [jax.device_put(a, jax.devices("gpu")[0]) for a in arrays]


@pytest.mark.parametrize("scheme", ["none", "dynamic"])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_cuda_matches_float64(rng, name, dtype, scheme):
    tokens, k, out, block = SHAPES[name]
    x, w, s = make_inputs(rng, tokens, k, out, dtype, block)
    y = jax.jit(lambda *a: fp8_linear(*a, block_shape=block, activation_scheme=scheme))(
        *gpu(x, w, s))
    assert y.devices().pop().platform == "gpu"
    assert y.shape == (tokens, out) and y.dtype == x.dtype
    got = np.asarray(y, np.float32)
    assert np.isfinite(got).all()
    want = fp8_linear_f64(x, w, s, block_shape=block, activation_scheme=scheme)
    assert rel(got, want) < TOL[dtype]


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 300), k_blocks=st.integers(1, 6), out=st.integers(1, 90),
       block=st.sampled_from([(0, 0), (128, 128)]), scheme=st.sampled_from(["none", "dynamic"]),
       wide=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_property_hopper_shapes_match_float64(tokens, k_blocks, out, block, scheme, wide, seed):
    """bf16 x at any token count up to 300 (every token tile, the 16-token one, the 64- and
    128-token ones, the cooperative one beyond 128, counts that are not multiples of 4), in a
    multiple of 128 (the Hopper GEMMs take it), out a multiple of 8 up to 720 rows or, with
    `wide`, 4096 + 8 * out rows (enough tiles for the wide and cooperative tiles on 132 SMs),
    both scale kinds and schemes: float64's result within bf16's tolerance."""
    rows = 8 * out + (4096 if wide else 0)
    x, w, s = make_inputs(np.random.default_rng(seed), tokens, 128 * k_blocks, rows, "bf16",
                          block)
    y = fp8_linear(*gpu(x, w, s), block_shape=block, activation_scheme=scheme)
    got = np.asarray(y, np.float32)
    assert np.isfinite(got).all()
    want = fp8_linear_f64(x, w, s, block_shape=block, activation_scheme=scheme)
    assert rel(got, want) < TOL["bf16"]


def test_hopper_stream_k_gives_the_same_bits_every_call(rng):
    """Stream-K adds the partial sums of a tile in a fixed order (deterministic reduction):
    calls on the same inputs return the same bits."""
    x, w, s = make_inputs(rng, 64, 14336, 4096, "bf16", (0, 0))
    f = jax.jit(fp8_linear)
    args = gpu(x, w, s)
    first = np.asarray(f(*args), np.float32)
    for _ in range(3):
        assert np.array_equal(np.asarray(f(*args), np.float32), first)


@pytest.mark.parametrize("scheme", ["none", "dynamic"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 130])
def test_a_nan_weight_gives_nan_in_its_output_channel(rng, tokens, dtype, scheme):
    """e4m3's NaN (0x7f, 0xff) in a weight row makes that channel NaN for every token, on
    every path (the skinny GEMM's and the tensor cores' bit-move conversion, CUTLASS's),
    as the float64 oracle and the CPU kernel give; the other channels stay finite."""
    x, w, s = make_inputs(rng, tokens, 4096, 256, dtype, (0, 0))
    bits = w.view(np.uint8).copy()
    bits[3, 5], bits[200, 4000] = 0x7F, 0xFF
    w = bits.view(w.dtype)
    got = np.asarray(fp8_linear(*gpu(x, w, s), activation_scheme=scheme), np.float32)
    want = fp8_linear_f64(x, w, s, block_shape=(0, 0), activation_scheme=scheme)
    assert np.isnan(got[:, [3, 200]]).all() and np.isnan(want[:, [3, 200]]).all()
    rest = np.delete(np.arange(256), [3, 200])
    assert np.isfinite(got[:, rest]).all()
    assert rel(got[:, rest], want[:, rest]) < TOL[dtype]


@pytest.mark.parametrize("scheme", ["none", "dynamic"])
def test_cuda_agrees_with_the_cpu_kernel(rng, scheme):
    """Same e4m3 activations on both (the quantization is exact f32 arithmetic): only the
    order of the f32 sums differs."""
    x, w, s = make_inputs(rng, 5, 4096, 1024, "f32", (128, 128))
    attrs = dict(block_shape=(128, 128), activation_scheme=scheme)
    got = fp8_linear(*gpu(x, w, s), **attrs)
    cpu = jax.devices("cpu")[0]
    want = fp8_linear(*(jax.device_put(a, cpu) for a in (x, w, s)), **attrs)
    assert rel(got, want) < 1e-5


def test_no_tokens(rng):
    x, w, s = make_inputs(rng, 0, 64, 32, "bf16", (0, 0))
    assert fp8_linear(*gpu(x, w, s)).shape == (0, 32)


@pytest.mark.parametrize("block", [(0, 0), (128, 128)])
@pytest.mark.parametrize("scheme", ["none", "dynamic"])
def test_the_xla_peer_on_the_gpu_matches_float64(rng, scheme, block):
    x, w, s = make_inputs(rng, 16, 1024, 512, "bf16", block)
    y = jax.jit(lambda *a: fp8_linear_xla(*a, block_shape=block, activation_scheme=scheme))(
        *gpu(x, w, s))
    want = fp8_linear_f64(x, w, s, block_shape=block, activation_scheme=scheme)
    assert rel(y, want) < TOL["bf16"]


def test_torch_eager_cuda_with_poisoned_memory(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from xla_kernels.frontends.torch import torch_op

    x, w, s = make_inputs(rng, 11, 200, 136, "bf16", (128, 128))
    args = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).cuda(),
            torch.from_numpy(w.view(np.uint8)).view(torch.float8_e4m3fn).cuda(),
            torch.from_numpy(s).cuda())
    for scheme in ("none", "dynamic"):
        # NaN left in the caching allocator's free memory, where the output is likely
        # placed: every output element must still be written.
        junk = torch.full((1 << 20,), float("nan"), dtype=torch.bfloat16, device="cuda")
        del junk
        y = torch_op(fp8_linear)(*args, block_shape=(128, 128), activation_scheme=scheme)
        torch.cuda.synchronize()
        got = y.float().cpu().numpy()
        assert np.isfinite(got).all()
        want = fp8_linear_f64(x, w, s, block_shape=(128, 128), activation_scheme=scheme)
        assert rel(got, want) < TOL["bf16"]


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "x 2 bytes off"])
def test_torch_eager_per_channel_any_alignment(rng, offset):
    """The Hopper path needs 16-byte aligned operands (TMA); a view 2 bytes into its storage
    must take another path, not read the wrong bytes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from xla_kernels.frontends.torch import torch_op

    tokens, k, out = 24, 1024, 256
    x, w, s = make_inputs(rng, tokens, k, out, "bf16", (0, 0))
    flat = torch.empty(tokens * k + 8, dtype=torch.bfloat16, device="cuda")
    xt = flat[offset:offset + tokens * k].view(tokens, k)
    xt.copy_(torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16))
    y = torch_op(fp8_linear)(
        xt, torch.from_numpy(w.view(np.uint8)).view(torch.float8_e4m3fn).cuda(),
        torch.from_numpy(s).cuda())
    torch.cuda.synchronize()
    want = fp8_linear_f64(x, w, s, block_shape=(0, 0), activation_scheme="none")
    assert rel(y.float().cpu().numpy(), want) < TOL["bf16"]


def test_the_hopper_path_is_built_where_cutlass_is_found():
    from xla_kernels.builder import cutlass
    from xla_kernels.kernels.fp8_linear import hopper_path_built

    if not cutlass.include_dirs():
        pytest.skip("CUTLASS's headers not found (XLA_KERNELS_CUTLASS_DIR, nvidia-cutlass)")
    assert hopper_path_built()


def test_sanitize_cases_pass():
    sanitize_cases("gpu")

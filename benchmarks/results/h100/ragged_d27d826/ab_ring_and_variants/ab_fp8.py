"""fp8 A/B: ring sizes (XLA_KERNELS_RAGGED_FP8_RING), mma.sync, bf16 vs f16 queries; TFLOP/s (ms)."""
import json, os, sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from xla_kernels.bench import budgeted_seconds, load_script
from xla_kernels.kernels.ragged_paged_attention import ragged_paged_attention
rb = load_script(Path("benchmarks/ragged_paged_attention.py"))
known = {c["name"]: c for c in rb.matrix(quick=False)}
cfgs = [known["prefill 4x4096 fp8"], known["chunked 8x512 of 8192 fp8"], known["mixed 64 decode + 4x512 fp8"]]
cfgs.append(dict(known["prefill 4x4096 d64"], name="prefill 4x4096 d64 fp8", fp8=True))
cfgs.append(dict(known["prefill 4x4096 d256"], name="prefill 4x4096 d256 fp8", fp8=True))
cfgs.append(dict(known["decode 32x8192"], q_lens=[1] * 32 + [64], kv_lens=[8192] * 32 + [64], name="decode-heavy 32x8192 + 1x64 fp8", fp8=True))
variants = json.loads(os.environ.get("AB_VARIANTS", '{"r32": {"XLA_KERNELS_RAGGED_FP8_RING": "32"}}'))
dtypes = os.environ.get("AB_DTYPES", "bf16,f16").split(",")
only = sys.argv[1:] or None
for cfg in cfgs:
    x = rb.make_data(cfg, np.random.default_rng(0))
    flops, _ = rb.work(cfg)
    kw = rb.attrs(cfg)
    for dt in dtypes:
        xd = dict(x, queries=x["queries"].astype(jnp.float16)) if dt == "f16" else x
        res = {}
        for _ in range(2):
            for vn, env in variants.items():
                for k in ("XLA_KERNELS_RAGGED_FP8_RING", "XLA_KERNELS_RAGGED_WGMMA"):
                    os.environ.pop(k, None)
                os.environ.update(env)
                f = jax.jit(lambda d, kw=kw: ragged_paged_attention(*(d[k] for k in rb.OURS_ARGS), **kw))
                sec = budgeted_seconds(f, (xd,), 0.25)
                res.setdefault(vn, []).append(f"{flops / sec / 1e12:.1f} ({sec * 1e3:.3f})")
        for k in ("XLA_KERNELS_RAGGED_FP8_RING", "XLA_KERNELS_RAGGED_WGMMA"):
            os.environ.pop(k, None)
        print(cfg["name"], dt, json.dumps(res), flush=True)

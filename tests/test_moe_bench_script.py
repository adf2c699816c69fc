"""benchmarks/moe.py on the CPU with its tiny model: every default peer runs, ours agrees with
the ragged_dot peer (bf16 and fp8 block weights), and the table and JSON are written (the
speed columns mean nothing on the CPU); the opt-in peers (tokamax, FlashInfer) record their
errors without stopping the run, tokamax's layer is the ragged_dot MoE on transposed
weights, and FlashInfer's weights have gate and up swapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from xla_kernels.bench import load_script

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "moe.py"


def test_tiny_run_writes_the_table_and_agrees_with_ragged_dot(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--tokens", "1",
                           "16", "--budget", "0.02", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "moe.json").read_text())["rows"]
    assert [(r["weights"], r["tokens"]) for r in rows] == [
        ("bf16", 1), ("bf16", 16), ("fp8 128x128", 1), ("fp8 128x128", 16)]
    for r in rows:
        assert all(r[f"{p}_ms"] > 0 for p in ("ours", "ragged_dot", "loop")), r
        assert r["err_vs_ragged_dot"] < 2e-2, r
        hit = r["experts_hit"]
        assert hit == 2 if r["tokens"] == 1 else 2 <= hit <= 8, r
    table = (tmp_path / "moe.md").read_text()
    assert "| tiny | bf16 | 1 | 2 |" in table and "Calls that failed" not in table


def test_opt_in_peers_record_their_errors_and_the_run_goes_on(tmp_path):
    """On the CPU (forced, also on a GPU machine) tokamax's kernels (or tokamax itself) and
    FlashInfer (no CUDA) fail: each row records why, and ours and ragged_dot still run."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "tiny", "--tokens", "1",
                           "--weights", "bf16", "--budget", "0.02", "--out", str(tmp_path),
                           "--peers", "ours", "ragged_dot", "tokamax", "flashinfer"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": src, "JAX_PLATFORMS": "cpu",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "moe.json").read_text())
    (row,) = result["rows"]
    assert row["ours_ms"] > 0 and row["ragged_dot_ms"] > 0, row
    assert row["tokamax_ms"] is None and row["tokamax_error"], row
    assert row["flashinfer_ms"] is None and row["flashinfer_error"], row
    assert set(result["peers"]) == {"tokamax", "flashinfer"}
    table = (tmp_path / "moe.md").read_text()
    assert "err tokamax | err flashinfer |" in table and "Calls that failed" in table


def test_the_tokamax_layer_is_the_ragged_dot_moe_on_transposed_weights():
    """The tokamax peer's layer with jax.lax's grouped GEMM in tokamax's place (weights
    [experts, in, out]) gives the ragged_dot peer's output, bf16 and fp8 block weights."""
    import jax.numpy as jnp

    moe = load_script(SCRIPT)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 256), jnp.bfloat16)
    logits = jax.random.normal(jax.random.PRNGKey(2), (16, 8), jnp.float32)
    for fp8 in (False, True):
        w = moe.weights("tiny", fp8)
        names = [k for k in ("w13", "w2", "w13_scale", "w2_scale") if k in w]
        wt = moe.transposed(w)
        ref = moe.layer("ragged_dot", fp8, 2)(x, logits, *(w[k] for k in names))
        out = moe.layer("tokamax", fp8, 2, jax.lax.ragged_dot_general)(
            x, logits, *(wt[k] for k in names))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_flashinfer_weights_swap_gate_and_up():
    torch = pytest.importorskip("torch")
    moe = load_script(SCRIPT)
    w = moe.weights("tiny", True)
    inter = moe.MODELS["tiny"][3]
    fw = moe.flashinfer_weights(w, inter, torch)
    w13 = np.asarray(jax.lax.bitcast_convert_type(w["w13"], np.uint8))
    got = fw["w13"].view(torch.uint8).cpu().numpy()
    np.testing.assert_array_equal(got[:, :inter], w13[:, inter:])
    np.testing.assert_array_equal(got[:, inter:], w13[:, :inter])
    half = inter // moe.BLOCK[0]
    s13 = np.asarray(w["w13_scale"])
    np.testing.assert_array_equal(fw["scales"][0].cpu().numpy()[:, :half], s13[:, half:])
    np.testing.assert_array_equal(fw["scales"][1].cpu().numpy(), np.asarray(w["w2_scale"]))


def test_the_flashinfer_peer_passes_route_xla_and_the_swapped_weights(monkeypatch):
    """run_flashinfer with a torch stand-in for cutlass_fused_moe that computes TensorRT-LLM's
    semantics (w13 rows [up, gate], SwiGLU, topk ids/weights given): its output is the
    ragged_dot peer's, so the routing and the gate/up swap reach the call as meant."""
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # run_flashinfer imports flashinfer_decode
    moe = load_script(SCRIPT)
    experts, top_k, hidden, inter = moe.MODELS["tiny"]
    w = moe.weights("tiny", False)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, hidden), jax.numpy.bfloat16)
    logits = jax.random.normal(jax.random.PRNGKey(2), (16, experts), jax.numpy.float32)

    def cutlass_fused_moe(x, ids, weights, w13, w2, dtype, quant_scales, output):
        assert quant_scales == [] and ids.dtype == torch.int32
        acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                up, gate = (w13[e].float() @ x[t].float()).split(inter)
                act = (torch.nn.functional.silu(gate) * up).to(dtype).float()
                acc[t] += weights[t, j] * (w2[e].float() @ act)
        output.copy_(acc.to(dtype))
        return [output]

    fi = {"fn": cutlass_fused_moe, "torch": torch}
    row: dict = {}
    out = moe.run_flashinfer(fi, moe.flashinfer_weights(w, inter, torch), x, logits, top_k, row)
    ref = np.asarray(moe.layer("ragged_dot", False, top_k)(x, logits, w["w13"], w["w2"]),
                     np.float32)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2
    assert row["flashinfer_ms"] > 0 and row["flashinfer_first_s"] > 0

"""benchmarks/vllm_throughput.py's host-share arithmetic (the run itself needs vLLM and a GPU):
busy time is the union of a device's intervals, and the decode step's device time is the
difference of the traced 1-token and full runs."""

from __future__ import annotations

import doctest
import sys
import types
from pathlib import Path

from xla_kernels.bench import load_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_script(ROOT / "benchmarks" / "vllm_throughput.py")


def test_doctests():
    assert doctest.testmod(_module()).failed == 0


def test_device_step_from_two_traced_runs(monkeypatch):
    module = _module()
    traces = {1: [{"ts": 0, "dur": 1000, "args": {"device": 0}}],
              5: [{"ts": 0, "dur": 3000, "args": {"device": 0}},
                  {"ts": 2000, "dur": 3000, "args": {"device": 0}}]}
    # decode_trace.record(run) traces run(); here run() returns its token count's events.
    monkeypatch.setitem(sys.modules, "decode_trace", types.SimpleNamespace(record=lambda f: f()))
    result = module.device_step(lambda n: traces[n], 5, wall_step_ms=2.0)
    device = result["devices"]["0"]
    assert device["busy_ms"] == {"first": 1.0, "full": 5.0}
    assert device["device_step_ms"] == 1.0 and device["host_share"] == 0.5

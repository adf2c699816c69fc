"""vLLM's SamplingParams through our backend (xla_kernels.vllm.sampling and its patches): one
vllm.LLM on SmolLM2-135M (f32, JAX-native path) shared by every test, each parameter against a
reference computed here from transformers' logits (f32, same weights) with the parameter's
rule as vLLM on CUDA applies it, and the refusals' messages."""

from __future__ import annotations

import os

import numpy as np
import pytest

MAX_TOKENS = 12
PROMPTS = ["The capital of France is", "def fibonacci(n):", "My favourite colour is blue, and"]
CHAT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import vllm
    from xla_kernels.vllm import models, reference

    checkpoint = models.smollm2(tmp_path_factory.mktemp("smollm2") / "model")
    # CPU: a fraction of XLA_KERNELS_VLLM_DEVICE_MEMORY_GB (4); GPU (JAX_PLATFORMS set
    # empty, scripts/gpu_vllm.sh sampling): the check's 0.5.
    memory = 0.6 if os.environ.get("JAX_PLATFORMS") == "cpu" else 0.5
    llm = vllm.LLM(model=str(checkpoint.path), dtype="float32", max_model_len=512,
                   max_num_seqs=4, max_num_batched_tokens=512, gpu_memory_utilization=memory,
                   seed=0)
    yield llm, reference.load(checkpoint.path), llm.get_tokenizer()
    del llm


def _generate(engine, prompts, **params):
    import vllm

    llm, _, _ = engine
    outputs = llm.generate(prompts, vllm.SamplingParams(**params), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _logits(engine, ids):
    """transformers' next-token logits (f64) after ``ids``."""
    import torch

    _, model, _ = engine
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].double().numpy()


def _reference(engine, prompt, steps, process, stop=()):
    """Greedy decoding of ``prompt`` where ``process(logits, output)`` rewrites each step's
    logits first; ends at a token in ``stop``."""
    _, _, tokenizer = engine
    ids = tokenizer(prompt)["input_ids"]
    out = []
    for _ in range(steps):
        token = int(np.argmax(process(_logits(engine, ids + out), ids, out)))
        out.append(token)
        if token in stop:
            break
    return out


def _greedy(engine, prompt, steps=MAX_TOKENS):
    return _reference(engine, prompt, steps, lambda x, prompt, out: x)


def _penalized(repetition=1.0, presence=0.0, frequency=0.0):
    """vLLM's penalties: repetition on every token of prompt or output (logit / r if > 0,
    else * r), then frequency x count and presence x (count > 0) over the output."""
    def process(x, prompt, out):
        x = x.copy()
        counts = np.bincount(out, minlength=x.size)[:x.size]
        seen = (counts > 0) | np.isin(np.arange(x.size), prompt)
        x[seen] = np.where(x[seen] > 0, x[seen] / repetition, x[seen] * repetition)
        return x - frequency * counts - presence * (counts > 0)
    return process


@pytest.mark.slow
@pytest.mark.parametrize(("name", "value", "rule"), [
    ("repetition_penalty", 1.5, dict(repetition=1.5)),
    ("presence_penalty", 1.5, dict(presence=1.5)),
    ("frequency_penalty", 1.0, dict(frequency=1.0)),
])
def test_penalty_gives_penalized_greedy(engine, name, value, rule):
    got = _generate(engine, PROMPTS, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                    **{name: value})
    want = [_reference(engine, p, MAX_TOKENS, _penalized(**rule)) for p in PROMPTS]
    assert want != [_greedy(engine, p) for p in PROMPTS], "the penalty must change something"
    assert got == want


@pytest.mark.slow
def test_logit_bias_gives_biased_greedy(engine):
    first = _greedy(engine, PROMPTS[0], 1)[0]
    bias = {first: -100.0, 1000: 6.0}
    got = _generate(engine, PROMPTS[:1], temperature=0.0, max_tokens=MAX_TOKENS,
                    ignore_eos=True, logit_bias=bias)

    def biased(x, prompt, out):
        x = x.copy()
        for token, b in bias.items():
            x[token] += b
        return x
    want = _reference(engine, PROMPTS[0], MAX_TOKENS, biased)
    assert want != _greedy(engine, PROMPTS[0])
    assert got == [want]


@pytest.mark.slow
def test_bad_words_are_never_completed(engine):
    _, _, tokenizer = engine
    words = [tokenizer.encode(w, add_special_tokens=False) for w in ("Paris", " Paris")]

    def banned(x, prompt, out):
        x = x.copy()
        for word in words:
            prefix = word[:-1]
            if len(prefix) <= len(out) and out[len(out) - len(prefix):] == prefix:
                x[word[-1]] = -np.inf
        return x
    got = _generate(engine, PROMPTS[:1], temperature=0.0, max_tokens=MAX_TOKENS,
                    ignore_eos=True, bad_words=[" Paris"])
    want = _reference(engine, PROMPTS[0], MAX_TOKENS, banned)
    assert _greedy(engine, PROMPTS[0], 1)[0] == words[1][0], "greedy starts with ' Paris'"
    assert got == [want]


@pytest.mark.slow
def test_min_tokens_holds_back_the_stop_tokens(engine):
    _, model, tokenizer = engine
    stops = {tokenizer.eos_token_id, model.config.eos_token_id}
    plain = _generate(engine, [CHAT], temperature=0.0, max_tokens=60)[0]
    assert plain[-1] in stops and len(plain) < 20, plain
    minimum = len(plain) + 5

    def held(x, prompt, out):
        x = x.copy()
        if len(out) < minimum:
            x[list(stops)] = -np.inf
        return x
    got = _generate(engine, [CHAT], temperature=0.0, max_tokens=60, min_tokens=minimum)[0]
    want = _reference(engine, CHAT, 60, held, stop=stops)
    assert len(got) >= minimum
    assert got == want


@pytest.mark.slow
def test_allowed_token_ids_restrict_greedy(engine):
    _, _, tokenizer = engine
    allowed = sorted(set(tokenizer.encode(" the a of blue red green is and Lyon",
                                          add_special_tokens=False)))

    def restricted(x, prompt, out):
        keep = np.full(x.size, -np.inf)
        keep[allowed] = x[allowed]
        return keep
    got = _generate(engine, PROMPTS[:1], temperature=0.0, max_tokens=MAX_TOKENS,
                    ignore_eos=True, allowed_token_ids=allowed)
    assert got == [_reference(engine, PROMPTS[0], MAX_TOKENS, restricted)]


def _probabilities(engine, prompt, tokens, temperature):
    """Per step: the reference's softmax(logits / T) on the engine's own prefix, and the
    engine's token."""
    _, _, tokenizer = engine
    ids = tokenizer(prompt)["input_ids"]
    for t, token in enumerate(tokens):
        x = _logits(engine, ids + tokens[:t]) / temperature
        p = np.exp(x - x.max())
        yield p / p.sum(), token


@pytest.mark.slow
def test_min_p_draws_only_tokens_above_min_p_times_the_best(engine):
    steps = 48
    got = _generate(engine, PROMPTS, temperature=1.5, min_p=0.1, max_tokens=steps,
                    ignore_eos=True, seed=7)
    plain = _generate(engine, PROMPTS, temperature=1.5, max_tokens=steps, ignore_eos=True,
                      seed=7)

    def below(runs):
        return sum(p[token] < 0.1 * p.max() * (1 - 1e-3)
                   for prompt, tokens in zip(PROMPTS, runs, strict=True)
                   for p, token in _probabilities(engine, prompt, tokens, 1.5))
    assert below(plain) > 10, "without min_p many draws fall below 0.1 x p_max"
    assert below(got) == 0


@pytest.mark.slow
def test_top_k_and_top_p_draw_inside_their_sets(engine):
    got = _generate(engine, PROMPTS, temperature=1.0, top_k=5, top_p=0.8, max_tokens=24,
                    ignore_eos=True, seed=3)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        for p, token in _probabilities(engine, prompt, tokens, 1.0):
            order = np.argsort(-p)
            top = p[order[:5]] / p[order[:5]].sum()
            nucleus = order[:int(np.searchsorted(np.cumsum(top), 0.8 - 1e-6)) + 1]
            assert token in nucleus, (token, order[:5], top)


@pytest.mark.slow
def test_seed_draws_what_the_sample_op_draws_on_the_reference_logits(engine):
    """A seeded request's token at position n is xla-kernels' sample op on its logits with
    key (seed, 0) and counter n, whatever else is in the batch."""
    import jax.numpy as jnp

    from xla_kernels.kernels.sampling import sample

    _, _, tokenizer = engine
    alone = _generate(engine, PROMPTS[:1], temperature=1.0, max_tokens=16, ignore_eos=True,
                      seed=1234)[0]
    batched = _generate(engine, PROMPTS, temperature=1.0, max_tokens=16, ignore_eos=True,
                        seed=1234)[0]
    other = _generate(engine, PROMPTS[:1], temperature=1.0, max_tokens=16, ignore_eos=True,
                      seed=99)[0]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    want = []
    for t in range(16):
        x = jnp.asarray(_logits(engine, ids + alone[:t])[None], jnp.float32)

        def row(v, dtype):
            return jnp.full((1,), v, dtype)
        want.append(int(sample(x, row(1.0, jnp.float32), row(0, jnp.int32),
                               row(1.0, jnp.float32), row(0.0, jnp.float32),
                               row(1234, jnp.uint32), row(len(ids) + t, jnp.int32))[0]))
    assert alone == want
    assert batched == alone
    assert other != alone


@pytest.mark.slow
@pytest.mark.parametrize(("name", "value"), [("logprob_token_ids", [5, 6])])
def test_unsupported_parameter_is_refused_by_name(engine, name, value):
    with pytest.raises(ValueError, match=f"SamplingParams {name} is not supported on this "
                                         "backend"):
        _generate(engine, PROMPTS[:1], max_tokens=4, **{name: value})


@pytest.mark.parametrize("name, value", [
    ("seed", 1), ("min_p", 0.1), ("repetition_penalty", 1.2), ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5), ("logit_bias", {3: 1.0}), ("allowed_token_ids", [3, 4]),
    ("bad_words", ["x"]), ("min_tokens", 3), ("logprobs", 1)])
def test_with_speculative_decoding_processed_parameters_are_refused(name, value):
    from vllm import SamplingParams
    from xla_kernels.vllm.sampling import refusal

    params = SamplingParams(**{name: value})
    assert refusal(params, speculative=False) is None
    message = refusal(params, speculative=True)
    assert f"SamplingParams {name} is not supported on this backend" in message
    assert "speculative decoding" in message


def test_platform_refuses_at_request_time_naming_the_parameter(monkeypatch):
    """vLLM's input processor calls the platform's validate_request for every request: a
    seed is taken (tpu-inference's platform refuses it), and refused with speculative
    decoding configured."""
    from vllm import SamplingParams
    from xla_kernels.vllm.platform import XlaKernelsPlatform

    XlaKernelsPlatform.validate_request({}, SamplingParams(seed=3, temperature=1.0))
    monkeypatch.setattr(XlaKernelsPlatform, "speculative", True)
    with pytest.raises(ValueError, match="SamplingParams seed is not supported on this backend"):
        XlaKernelsPlatform.validate_request({}, SamplingParams(seed=3, temperature=1.0))

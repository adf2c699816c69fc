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


def _stops(engine):
    """The tokens that end a request (no ``ignore_eos``)."""
    _, model, tokenizer = engine
    return {tokenizer.eos_token_id, model.config.eos_token_id}


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
    stops = _stops(engine)
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


def _log_softmax(x):
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


LOGPROB_TOLERANCE = 2e-3
"""How far an engine logprob (f32) may be from the reference's (f64 over f32 logits)."""


@pytest.mark.slow
def test_logprobs_are_the_reference_log_softmax_of_the_top_tokens(engine):
    """``logprobs=3`` (vLLM's default ``raw_logprobs``): per step the drawn token and the
    top 3, each with the reference's log-softmax at the engine's prefix and its rank."""
    import vllm

    llm, _, tokenizer = engine
    out = llm.generate(PROMPTS[:1], vllm.SamplingParams(temperature=0.0, max_tokens=6,
                                                        logprobs=3), use_tqdm=False)[0]
    tokens = list(out.outputs[0].token_ids)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    assert len(out.outputs[0].logprobs) == len(tokens) == 6
    for t, (token, step) in enumerate(zip(tokens, out.outputs[0].logprobs, strict=True)):
        want = _log_softmax(_logits(engine, ids + tokens[:t]))
        order = np.argsort(-want)
        assert token == order[0]
        assert set(step) == set(order[:3].tolist())
        for candidate, logprob in step.items():
            assert abs(logprob.logprob - want[candidate]) < LOGPROB_TOLERANCE, (t, candidate)
            assert logprob.rank == 1 + int(np.sum(want > want[candidate]))


@pytest.mark.slow
def test_prompt_logprobs_score_each_prompt_token_on_its_prefix(engine):
    import vllm

    llm, _, tokenizer = engine
    out = llm.generate(PROMPTS[1:2], vllm.SamplingParams(temperature=0.0, max_tokens=1,
                                                         prompt_logprobs=2),
                       use_tqdm=False)[0]
    ids = tokenizer(PROMPTS[1])["input_ids"]
    assert list(out.prompt_token_ids) == ids
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for j in range(1, len(ids)):
        want = _log_softmax(_logits(engine, ids[:j]))
        top = np.argsort(-want)[:2].tolist()
        got = out.prompt_logprobs[j]
        assert set(got) == {ids[j], *top}, j
        for candidate, logprob in got.items():
            assert abs(logprob.logprob - want[candidate]) < LOGPROB_TOLERANCE, (j, candidate)


@pytest.mark.slow
def test_n_completions_are_the_requests_with_seed_plus_index(engine):
    """``n=3`` with a seed: vLLM runs child requests with seeds seed, seed + 1, seed + 2."""
    import vllm

    llm, _, _ = engine
    params = dict(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = llm.generate(PROMPTS[:1], vllm.SamplingParams(n=3, seed=100, **params),
                       use_tqdm=False)[0]
    got = [list(c.token_ids) for c in sorted(out.outputs, key=lambda c: c.index)]
    want = [_generate(engine, PROMPTS[:1], seed=100 + i, **params)[0] for i in range(3)]
    assert got == want
    assert len({tuple(t) for t in got}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_ends_the_text_at_it(engine, include):
    """Greedy continues " Paris." here: stopping at "." ends the text before it (or with it,
    ``include_stop_str_in_output``)."""
    import vllm

    llm, _, tokenizer = engine
    text = tokenizer.decode(_greedy(engine, PROMPTS[0]))
    end = text.index(".") + include
    out = llm.generate(PROMPTS[:1], vllm.SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, stop=["."],
        include_stop_str_in_output=include), use_tqdm=False)[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (text[:end], "stop", ".")


@pytest.mark.slow
def test_chat_gives_the_tokens_of_generate_on_the_chat_template(engine):
    """``llm.chat`` renders SmolLM2's chat template; ``generate`` on the token ids the
    tokenizer's ``apply_chat_template`` gives decodes the same greedy tokens, which are
    transformers' greedy tokens."""
    import vllm

    llm, _, tokenizer = engine
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    chat = llm.chat(messages, params, use_tqdm=False)[0]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    plain = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    assert list(chat.prompt_token_ids) == ids
    assert list(chat.outputs[0].token_ids) == list(plain.outputs[0].token_ids)
    assert list(chat.outputs[0].token_ids) == _reference(engine, text, MAX_TOKENS,
                                                         lambda x, prompt, out: x,
                                                         stop=_stops(engine))


PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"enum": ["Paris", "London", "Berlin"]}}}
"""The JSON schema of the structured-output test (xgrammar, vLLM's default backend)."""


def _structured(engine, prompts, constraint, max_tokens=64, plain=()):
    """Greedy texts and finish reasons of ``prompts`` under ``StructuredOutputsParams(
    **constraint)``; the prompts at indices in ``plain`` run unconstrained in the same
    batch."""
    from vllm import SamplingParams, sampling_params

    llm, _, _ = engine
    base = dict(temperature=0.0, max_tokens=max_tokens)
    params = [SamplingParams(**base) if i in plain else SamplingParams(
        structured_outputs=sampling_params.StructuredOutputsParams(**constraint), **base)
        for i in range(len(prompts))]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].text, o.outputs[0].finish_reason, list(o.outputs[0].token_ids))
            for o in outputs]


@pytest.mark.slow
def test_structured_output_json_schema_gives_matching_json(engine):
    import json

    prompts = ["Describe a person as JSON:", "The capital of France is"]
    for text, finish, _ in _structured(engine, prompts, {"json": PERSON}):
        assert finish == "stop", text
        person = json.loads(text)
        assert set(person) == {"name", "age", "city"}, person
        assert isinstance(person["name"], str)
        assert isinstance(person["age"], int) and not isinstance(person["age"], bool)
        assert person["city"] in PERSON["properties"]["city"]["enum"]


@pytest.mark.slow
def test_structured_output_regex_gives_a_full_match(engine):
    import re

    pattern = r"[A-Z][a-z]{2,8} (19|20)[0-9]{2}"
    for text, finish, _ in _structured(engine, PROMPTS, {"regex": pattern}):
        assert finish == "stop", text
        assert re.fullmatch(pattern, text), text


@pytest.mark.slow
def test_structured_output_leaves_the_other_requests_of_its_batch_alone(engine):
    """The grammar's mask applies to its own row: an unconstrained request batched with
    constrained ones gives plain greedy tokens."""
    got = _structured(engine, PROMPTS, {"choice": ["Paris", "London"]}, max_tokens=MAX_TOKENS,
                      plain={1})
    assert got[1][2] == _reference(engine, PROMPTS[1], MAX_TOKENS, lambda x, prompt, out: x,
                                   stop=_stops(engine))
    assert {got[0][0], got[2][0]} <= {"Paris", "London"}


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

"""The key/value cache (tinygrad_attn.generation): a cached step gives the
full forward's outputs, GPT.generate and Seq2SeqTransformer.greedy_decode
give the same ids with and without it, and the context window follows its
documented rule."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import generation, nn
from tinygrad_attn.data import EOS, PAD
from tinygrad_attn.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer, _sample

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}  # relative to the largest output


def randomize(model, seed=0):
    """Weights far from the GPT init, whose std 0.02 makes attention nearly
    uniform and would hide a wrong mask or position: matrices N(0, 1/fan_in),
    and noise of std 0.1 on every bias and LayerNorm weight."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        if p.ndim > 1:
            p.data[...] = rng.normal(0.0, p.shape[-1] ** -0.5, p.shape)
        else:
            p.data += rng.normal(0.0, 0.1, p.shape).astype(p.dtype)
    return model


def gpt(dtype=np.float32, seed=0, **kwargs):
    tg.manual_seed(seed)
    config = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    config.update(kwargs)
    return randomize(GPT(GPTConfig(**config)), seed).to(dtype).eval()


def seq2seq(dtype=np.float32, seed=0, **kwargs):
    tg.manual_seed(seed)
    config = dict(vocab_size=9, d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                  dim_feedforward=32)
    config.update(kwargs)
    return randomize(Seq2SeqTransformer(Seq2SeqConfig(**config)), seed).to(dtype).eval()


def ids(shape, high, low=0, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.int64)


def assert_close(actual, expected, dtype):
    assert actual.dtype == dtype
    scale = np.abs(expected).max()
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype] * scale)


def chunks(total, first):
    """Positions fed per call: a prefill of `first`, then one at a time."""
    return [first] + [1] * (total - first)


# --------------------------------------------------------------------------- one step = the full forward
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [{}, dict(bias=False, tie_weights=False)])
def test_cached_gpt_steps_give_the_logits_of_the_full_forward(dtype, options):
    model = gpt(dtype, **options)
    x = ids((3, 8), 11)
    for sizes in (chunks(8, 1), chunks(8, 5), [3, 2, 1, 2]):  # [3, 2, ...]: a prefill after cached ones
        caches = generation.caches_for(model.transformer.layers, 3, 8, dtype)
        t = 0
        for p in sizes:
            logits = generation.gpt_step(model, x[:, t:t + p], caches)
            t += p
            with tg.no_grad():
                assert_close(logits, model(x[:, :t]).data[:, -1], dtype)
        assert caches[0].length == 8


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cached_encoder_layer_steps_give_the_causal_layer_output(norm_first, activation, dtype):
    """Both norm orders, at every position of a prefill and of the steps after it."""
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=24, dropout=0.0, activation=activation,
                                       norm_first=norm_first, batch_first=True)
    layer = randomize(layer).to(dtype).eval()
    x = np.random.default_rng(1).normal(size=(2, 7, 16)).astype(dtype)
    with tg.no_grad():
        causal = nn.Transformer.generate_square_subsequent_mask(7, dtype=dtype)
        expected = layer(tg.Tensor(x), src_mask=causal, is_causal=True).data
    cache = generation.KVCache(2, 4, 7, 4, dtype)
    t, outputs = 0, []
    for p in chunks(7, 3):
        outputs.append(generation.encoder_layer_step(layer, x[:, t:t + p], cache))
        t += p
    assert_close(np.concatenate(outputs, axis=1), expected, dtype)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cached_seq2seq_steps_give_the_logits_of_the_decoder(norm_first, dtype):
    """Source padding included: a row with padding, and one that is all padding
    (its cross-attention sees no key, as in MultiheadAttention)."""
    model = seq2seq(dtype, norm_first=norm_first)
    src = ids((4, 6), 9, low=3)
    src[1, 3:] = PAD
    src[2, :] = PAD
    padding = src == PAD
    tgt = ids((4, 7), 9, low=1, seed=1)
    with tg.no_grad():
        memory = model.encode(src, padding)
        memory_kvs = [generation.memory_keys_values(layer.multihead_attn, memory)
                      for layer in model.transformer.decoder.layers]
        caches = generation.caches_for(model.transformer.decoder.layers, 4, 7, dtype)
        t = 0
        for p in chunks(7, 2):
            logits = generation.seq2seq_step(model, tgt[:, t:t + p], caches, memory_kvs, padding)
            t += p
            expected = model.decode(tgt[:, :t], memory, memory_key_padding_mask=padding).data[:, -1]
            assert np.isfinite(expected).all()
            assert_close(logits, expected, dtype)


def test_a_cache_refuses_more_positions_than_it_holds():
    cache = generation.KVCache(1, 2, 3, 4, np.float32)
    cache.append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="4 positions do not fit a cache of 3"):
        cache.append(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)))


# --------------------------------------------------------------------------- GPT.generate
@pytest.mark.parametrize("batch, prompt, new, temperature, top_k", [
    (1, 3, 4, 0.8, None),   # below block_size 8: the window never fills
    (2, 3, 5, 0.0, None),   # greedy, up to exactly block_size ids
    (3, 2, 40, 0.8, None),  # well past it: eleven window restarts, batch 3
    (2, 12, 25, 1.0, 3),    # a prompt longer than the block, top_k
    (1, 1, 30, 0.0, None),  # greedy, well past the block
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generate_gives_the_same_ids_with_and_without_the_cache(batch, prompt, new, temperature, top_k,
                                                                dtype):
    model = gpt(dtype)
    x = ids((batch, prompt), 11, seed=2)
    outs, rngs = [], []
    for use_cache in (False, True):
        rng = np.random.default_rng(3)
        outs.append(model.generate(x, new, temperature=temperature, top_k=top_k, generator=rng,
                                   use_cache=use_cache))
        rngs.append(rng.random())  # the same number of draws
    assert outs[0].shape == (batch, prompt + new) and (outs[0][:, :prompt] == x).all()
    assert (outs[0] == outs[1]).all()
    assert rngs[0] == rngs[1]
    print(len(np.unique(outs[0][:, prompt:])))


def window_log(model, monkeypatch, use_cache, prompt, new):
    """How many positions the model is run on at each step."""
    calls = []
    if use_cache:
        step = generation.gpt_step
        monkeypatch.setattr(generation, "gpt_step",
                            lambda m, x, caches: calls.append(x.shape[1]) or step(m, x, caches))
    else:
        forward = model.forward
        monkeypatch.setattr(model, "forward", lambda x: calls.append(x.shape[1]) or forward(x))
    model.generate(ids((2, prompt), 11), new, use_cache=use_cache)
    return calls


def test_the_window_restarts_from_its_last_half_and_the_cache_feeds_one_id_per_step(monkeypatch):
    model = gpt()  # block_size 8: a full window restarts from its last 4 ids
    assert model.context_keep() == 4
    assert window_log(model, monkeypatch, False, 6, 10) == [6, 7, 8, 4, 5, 6, 7, 8, 4, 5]
    assert window_log(model, monkeypatch, True, 6, 10) == [6, 1, 1, 4, 1, 1, 1, 1, 4, 1]
    assert window_log(model, monkeypatch, False, 11, 3) == [8, 4, 5]  # a long prompt: its last 8 ids
    assert window_log(model, monkeypatch, True, 11, 3) == [8, 4, 1]


def test_generate_with_the_cache_follows_a_step_by_step_reference_of_the_window_rule():
    """The window rule written out, with the full forward and the same draws."""
    model = gpt()
    x = ids((2, 5), 11)
    out = model.generate(x, 20, temperature=0.9, top_k=6, generator=np.random.default_rng(4))
    expected, start, rng = x, 0, np.random.default_rng(4)
    with tg.no_grad():
        for _ in range(20):
            if expected.shape[1] - start > 8:  # the window is full: keep its last 4 ids
                start = expected.shape[1] - 4
            logits = model(expected[:, start:]).data[:, -1].astype(np.float64)
            expected = np.concatenate([expected, _sample(logits, 0.9, 6, rng)[:, None]], axis=1)
    assert (out == expected).all()


def test_generate_restores_training_mode_and_checks_the_prompt_ids():
    model = gpt().train()
    model.generate(np.array([1, 2]), 12)
    assert model.training
    with pytest.raises(ValueError, match=r"GPT.generate: token ids must be in \[0, 11\)"):
        model.generate(np.array([1, 11]), 3)


# --------------------------------------------------------------------------- greedy_decode
@pytest.mark.parametrize("norm_first", [False, True])
def test_greedy_decode_gives_the_same_ids_with_and_without_the_cache(norm_first):
    src = np.array([[4, 5, 6, 7, 8], [8, 3, PAD, PAD, PAD], [5, 5, 5, 5, PAD], [6, 7, 8, 3, 4]])
    mixed = False
    for seed in range(4):
        for eos_bias in (0.0, 1.0, 2.0):  # favour EOS, so that some sequences end before others
            model = seq2seq(seed=seed, norm_first=norm_first)
            model.generator.bias.data[EOS] += eos_bias
            cached, uncached = model.greedy_decode(src), model.greedy_decode(src, use_cache=False)
            assert cached.shape == uncached.shape and (cached == uncached).all()
            lengths = [(row == EOS).argmax() if (row == EOS).any() else len(row) for row in cached]
            mixed |= len(set(lengths)) > 1
            one = src[1]  # one sequence, a shorter max_len
            short = model.greedy_decode(one, max_len=3)
            assert short.ndim == 1 and len(short) <= 3
            assert (short == model.greedy_decode(one, max_len=3, use_cache=False)).all()
    assert mixed, "the test needs a batch whose sequences end at different steps"


def test_the_generation_benchmark_runs_and_finds_the_same_ids():
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / "benchmarks" / "generation.py"), "--length", "20",
               "--sequences", "10", "--rounds", "1", "--threads", "1"]
    done = subprocess.run(command, env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("same ids with and without the cache: yes") == 2, done.stdout
    assert "use_cache=True" in done.stdout and "tokens/s" in done.stdout

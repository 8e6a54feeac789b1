"""The ready-made models: shapes, masks, causality, decoding and sampling,
configs that round-trip through JSON, and gradients of the whole model."""
import json

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import data, nn
from tinygrad_attn import functional as F
from tinygrad_attn.data import BOS, EOS, PAD
from tinygrad_attn.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer, _sample
from tinygrad_attn.shapes import ShapeError

from .nn_helpers import module_gradcheck


def small_seq2seq(seed=0, **kwargs):
    tg.manual_seed(seed)
    config = dict(vocab_size=9, d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                  dim_feedforward=32)
    config.update(kwargs)
    return Seq2SeqTransformer(Seq2SeqConfig(**config))


def small_gpt(seed=0, **kwargs):
    tg.manual_seed(seed)
    config = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    config.update(kwargs)
    return GPT(GPTConfig(**config))


def random_ids(shape, low, high, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.int64)


# --------------------------------------------------------------------------- configs
@pytest.mark.parametrize("config", [Seq2SeqConfig(vocab_size=13, d_model=32, dropout=0.1, norm_first=True),
                                    GPTConfig(vocab_size=65, n_embd=48, tie_weights=False, bias=False)])
def test_configs_round_trip_through_json(config):
    text = config.to_json()
    assert json.loads(text)["kind"] == type(config).__name__
    assert type(config).from_json(text) == config


def test_config_json_of_another_kind_or_with_unknown_fields_is_rejected():
    with pytest.raises(ValueError, match="is a GPTConfig, not a Seq2SeqConfig"):
        Seq2SeqConfig.from_json(GPTConfig(vocab_size=5).to_json())
    with pytest.raises(ValueError, match="unknown fields"):
        GPTConfig.from_json(json.dumps({"vocab_size": 5, "n_embed": 3}))


def test_gpt_feed_forward_width_defaults_to_four_times_the_embedding():
    assert GPTConfig(vocab_size=5, n_embd=24).dim_feedforward == 96


def test_gpt_gelu_option_and_configs_saved_before_it():
    from tinygrad_attn.models import gelu_tanh
    x = tg.tensor(np.linspace(-3, 3, 7))
    exact, tanh = small_gpt(), small_gpt(gelu="tanh")
    assert exact.transformer.layers[0].activation(x).data.tolist() == F.gelu(x).data.tolist()
    assert tanh.transformer.layers[0].activation is gelu_tanh
    np.testing.assert_allclose(gelu_tanh(x).data, F.gelu(x, approximate="tanh").data)
    assert not np.allclose(gelu_tanh(x).data, F.gelu(x).data, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="gelu must be one of exact, tanh"):
        GPTConfig(vocab_size=5, gelu="fast")
    old = json.loads(GPTConfig(vocab_size=5).to_json())
    del old["gelu"]
    assert GPTConfig.from_json(json.dumps(old)).gelu == "exact"  # what older checkpoints used


# --------------------------------------------------------------------------- seq2seq
def test_seq2seq_logits_shape_and_every_parameter_gets_a_gradient():
    model = small_seq2seq()
    src, tgt_in = random_ids((3, 5), 3, 9), random_ids((3, 6), 3, 9, seed=1)
    logits = model(src, tgt_in)
    assert logits.shape == (3, 6, 9) and logits.dtype == np.float32
    F.cross_entropy(logits.reshape(-1, 9), random_ids((18,), 0, 9)).backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_seq2seq_embeddings_are_scaled_by_sqrt_d_model():
    model = small_seq2seq(d_model=16)
    ids = np.array([[4, 5]])
    x = model._embed(model.src_embed, ids).data[0]
    expected = model.src_embed.weight.data[[4, 5]] * 4.0 + nn.sinusoidal_table(2, 16)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-6)
    # N(0, 1/d_model) init: after the scale, entries of unit size like the positional table
    assert 0.8 < model.src_embed.weight.data.std() * 4.0 < 1.2


def test_seq2seq_decoder_is_causal():
    model = small_seq2seq().eval()
    src = random_ids((2, 5), 3, 9)
    tgt = random_ids((2, 6), 3, 9, seed=1)
    changed = tgt.copy()
    changed[:, 4:] = random_ids((2, 2), 3, 9, seed=2)
    with tg.no_grad():
        a, b = model(src, tgt).data, model(src, changed).data
    np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_seq2seq_ignores_source_padding():
    """Padding positions are masked: extra PAD columns change nothing."""
    model = small_seq2seq().eval()
    src = np.array([[4, 5, 6, PAD], [7, 8, PAD, PAD]])
    wider = np.concatenate([src, np.full((2, 3), PAD)], axis=1)
    tgt = np.array([[BOS, 6, 5], [BOS, 8, 7]])
    with tg.no_grad():
        np.testing.assert_allclose(model(src, tgt).data, model(wider, tgt).data, rtol=1e-5, atol=1e-6)


def test_seq2seq_gradcheck_float64():
    """The model's own parts (embeddings with their sqrt(d_model) scale, the
    output layer) by finite differences; the Transformer inside is checked
    layer by layer in the nn tests, and here held fixed."""
    model = small_seq2seq(d_model=4, nhead=2, dim_feedforward=6, vocab_size=6).double()
    src, tgt_in, tgt_out = np.array([[3, 4, PAD]]), np.array([[BOS, 4, 3]]), np.array([[4, 3, EOS]])
    slots = [(model.src_embed, "weight"), (model.tgt_embed, "weight"), (model.generator, "weight"),
             (model.generator, "bias")]

    def loss(*params):
        for (owner, attr), value in zip(slots, params):
            setattr(owner, attr, value)
        return F.cross_entropy(model(src, tgt_in).reshape(-1, 6), tgt_out.reshape(-1))

    params = [tg.Tensor(getattr(owner, attr).data.copy(), requires_grad=True) for owner, attr in slots]
    assert tg.gradcheck(loss, params)


def greedy_reference(model, src, max_len):
    """One sequence at a time, the argmax appended until EOS."""
    out = []
    for row in src:
        row = row[row != PAD][None]
        with tg.no_grad():
            memory = model.encode(row)
            ys = [BOS]
            for _ in range(max_len):
                nxt = int(model.decode(np.array([ys]), memory).data[0, -1].argmax())
                ys.append(nxt)
                if nxt == EOS:
                    break
        out.append(ys[1:])
    return out


def test_greedy_decode_matches_a_one_sequence_at_a_time_reference():
    src = np.array([[4, 5, 6, 7], [8, 3, PAD, PAD], [5, 5, 5, PAD], [6, 7, 8, 3]])
    mixed = False
    for seed in range(3):
        for eos_bias in (0.5, 1.0):  # favour EOS, so that some sequences end before others
            model = small_seq2seq(seed=seed).eval()
            model.generator.bias.data[EOS] += eos_bias
            out = model.greedy_decode(src)
            expected = greedy_reference(model, src, max_len=5)
            assert out.dtype == np.int64 and out.shape == (4, max(len(e) for e in expected))
            for row, e in zip(out, expected):
                assert row[:len(e)].tolist() == e
                assert (row[len(e):] == PAD).all()  # PAD after a sequence's EOS
            mixed |= len({len(e) for e in expected}) > 1
    assert mixed, "the test needs a batch whose sequences end at different steps"


def test_greedy_decode_stops_at_eos_and_at_max_len():
    model = small_seq2seq()
    model.generator.weight.data[:] = 0
    model.generator.bias.data[:] = 0
    model.generator.bias.data[EOS] = 5.0  # always EOS
    assert model.greedy_decode(np.array([[4, 5, 6]])).tolist() == [[EOS]]
    model.generator.bias.data[EOS] = 0.0
    model.generator.bias.data[7] = 5.0  # never EOS: stops after max_len tokens
    assert model.greedy_decode(np.array([4, 5, 6])).tolist() == [7, 7, 7, 7]
    assert model.greedy_decode(np.array([4, 5, 6]), max_len=2).tolist() == [7, 7]
    assert model.training, "greedy_decode restores training mode"


def test_greedy_decode_learns_nothing_and_bad_input_is_reported():
    model = small_seq2seq()
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 9\)"):
        model.greedy_decode(np.array([[4, 12]]))
    with pytest.raises(TypeError, match="integers"):
        model(np.ones((1, 2)), np.ones((1, 2), dtype=np.int64))
    with pytest.raises(ShapeError, match="same B"):
        model(np.ones((2, 3), dtype=np.int64), np.ones((3, 3), dtype=np.int64))


def test_attention_layers_of_seq2seq_name_every_attention():
    model = small_seq2seq(num_encoder_layers=2, num_decoder_layers=1)
    names = [name for name, _ in model.attention_layers()]
    assert names == ["encoder.0.self_attn", "encoder.1.self_attn", "decoder.0.self_attn",
                     "decoder.0.cross_attn"]
    assert all(isinstance(m, nn.MultiHeadAttention) for _, m in model.attention_layers())


# --------------------------------------------------------------------------- GPT
def test_gpt_logits_shape_tied_weights_and_gradients():
    model = small_gpt()
    assert model.lm_head.weight is model.tok_emb.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and len(names) == len(set(names))
    idx = random_ids((3, 8), 0, 11)
    logits = model(idx)
    assert logits.shape == (3, 8, 11)
    F.cross_entropy(logits.reshape(-1, 11), random_ids((24,), 0, 11)).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


def test_gpt_init_follows_gpt2():
    model = small_gpt(n_embd=64, n_layer=4, block_size=64, vocab_size=50)
    assert abs(model.tok_emb.weight.data.std() - 0.02) < 0.002
    layer = model.transformer.layers[0]
    assert abs(layer.linear1.weight.data.std() - 0.02) < 0.002
    assert abs(layer.linear2.weight.data.std() - 0.02 / np.sqrt(8)) < 0.001
    assert not layer.linear1.bias.data.any()
    assert layer.norm_first


def test_gpt_is_causal():
    """The logits at position t do not depend on the ids after t."""
    model = small_gpt().eval()
    idx = random_ids((2, 8), 0, 11)
    for t in (0, 3, 6):
        changed = idx.copy()
        changed[:, t + 1:] = random_ids((2, 7 - t), 0, 11, seed=t + 1)
        with tg.no_grad():
            a, b = model(idx).data, model(changed).data
        np.testing.assert_allclose(a[:, :t + 1], b[:, :t + 1], rtol=1e-5, atol=1e-6)
        assert not np.allclose(a[:, t + 1:], b[:, t + 1:])


def test_gpt_gradcheck_float64():
    model = small_gpt(n_embd=4, n_head=2, n_layer=1, vocab_size=5, block_size=4, tie_weights=False)
    idx, target = np.array([[1, 4, 0]]), np.array([4, 0, 2])
    assert module_gradcheck(model, [], forward=lambda m: F.cross_entropy(m(idx).reshape(-1, 5), target))


def test_gpt_rejects_contexts_longer_than_the_block_and_bad_ids():
    model = small_gpt()
    with pytest.raises(ShapeError, match="block_size 8"):
        model(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        model(np.array([[3, 11]]))


def test_generate_at_temperature_zero_is_greedy():
    """Within one block; the context window past it: tests/test_generation.py."""
    model = small_gpt().eval()
    prompt = random_ids((2, 3), 0, 11)
    out = model.generate(prompt, 5, temperature=0)
    assert out.shape == (2, 8) and (out[:, :3] == prompt).all()
    ids = prompt
    with tg.no_grad():
        for _ in range(5):  # the reference: argmax of the last position
            nxt = model(ids).data[:, -1].argmax(-1)
            ids = np.concatenate([ids, nxt[:, None]], axis=1)
    assert (out == ids).all()
    # top_k=1 is greedy whatever the temperature
    assert (model.generate(prompt, 5, temperature=2.0, top_k=1) == ids).all()


def test_generate_is_reproducible_with_a_seeded_generator():
    model = small_gpt()
    a = model.generate(np.array([1, 2]), 10, generator=np.random.default_rng(5))
    b = model.generate(np.array([1, 2]), 10, generator=np.random.default_rng(5))
    assert a.shape == (12,) and (a == b).all()
    tg.manual_seed(7)
    c = model.generate(np.array([1, 2]), 10)
    tg.manual_seed(7)
    assert (model.generate(np.array([1, 2]), 10) == c).all()


def test_sampling_follows_softmax_with_temperature_and_top_k():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    rng = np.random.default_rng(0)
    n = 20000

    def frequencies(temperature, top_k):
        draws = _sample(np.repeat(logits, n, axis=0), temperature, top_k, rng)  # n rows, one draw each
        return np.bincount(draws, minlength=4) / n

    def expected(temperature, top_k):
        z = logits[0] / temperature
        if top_k is not None:
            z = np.where(z < np.sort(z)[-top_k], -np.inf, z)
        p = np.exp(z - z.max())
        return p / p.sum()

    for temperature, top_k in ((1.0, None), (0.5, None), (2.0, None), (1.0, 2), (0.7, 3)):
        p = expected(temperature, top_k)
        tolerance = 4 * np.sqrt(p * (1 - p) / n) + 1e-12  # four standard errors
        np.testing.assert_array_less(np.abs(frequencies(temperature, top_k) - p), tolerance)
    assert frequencies(1.0, 2)[:2].sum() == 0  # outside the top 2: never drawn


def test_generate_rejects_bad_settings():
    model = small_gpt()
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([1]), 2, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(np.array([1]), 2, top_k=0)
    with pytest.raises(ShapeError, match="non-empty"):
        model.generate(np.zeros((1, 0), dtype=np.int64), 2)


def test_models_work_with_the_task_data():
    """A seq2seq batch of a built-in task goes through the model as is."""
    task = data.ReverseTask(num_symbols=6, length=5, min_length=2)
    batch = task.train_batch(4, generator=np.random.default_rng(0))
    model = small_seq2seq(vocab_size=task.vocab_size)
    logits = model(batch.src, batch.tgt_in)
    assert logits.shape == (4, 6, task.vocab_size)
    loss = F.cross_entropy(logits.reshape(-1, task.vocab_size), batch.tgt_out.reshape(-1), ignore_index=PAD)
    assert np.isfinite(loss.item())

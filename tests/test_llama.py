"""models.Llama: llama2.c's model, loaded from a PyTorch state dict with its
names (examples/torch_models.py's Llama, written after llama2.c's model.py)
and giving its logits and gradients; generation with a key/value cache of
the shared heads only; the reference ops path.

And against llama2.c's own code (https://github.com/karpathy/llama2.c),
unchanged copies of which are in tests/third_party/llama2c: the same
against its model.py run under torch, and its run.c, compiled with gcc,
generating our greedy tokens from an `export --to llama2c`. LLAMA2C_DIR,
when set, names another llama2.c checkout to test against instead."""
import dataclasses
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import generation
from tinygrad_attn.models import FeedForward, Llama, LlamaConfig, llama_hidden_dim

from .nn_helpers import ops_in_graph
from .test_examples import load

# llama2.c's ModelArgs, field by field, in its order
MODEL_ARGS = ["dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "multiple_of", "norm_eps",
              "max_seq_len", "dropout"]
SMALL = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=13, multiple_of=16, max_seq_len=16)
TORCH_DTYPES = {np.float32: torch.float32, np.float64: torch.float64}


def twin_and_ours(dtype, **overrides):
    """llama2.c's model (our torch twin) with random weights (norm weights too),
    and ours loaded from its state_dict unchanged."""
    torch.manual_seed(0)
    config = LlamaConfig(**{**SMALL, **overrides})
    theirs = load("torch_models").Llama(**dataclasses.asdict(config)).to(TORCH_DTYPES[dtype])
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1 else 0.0))
    ours = Llama(config)
    if dtype == np.float64:
        ours.double()
    ours.load_state_dict(theirs.state_dict())  # strict: every name is llama2.c's
    if dtype == np.float64:  # the rotary tables are float32 in both, equal to one unit in the last place
        ours.freqs_cos.data[:], ours.freqs_sin.data[:] = theirs.freqs_cos.numpy(), theirs.freqs_sin.numpy()
    return theirs, ours


def test_config_fields_are_llama2cs_model_args():
    assert [f.name for f in dataclasses.fields(LlamaConfig)] == MODEL_ARGS
    assert LlamaConfig.from_json(LlamaConfig(vocab_size=65).to_json()) == LlamaConfig(vocab_size=65)
    with pytest.raises(ValueError, match="n_kv_heads 3 must divide n_heads"):
        LlamaConfig(n_heads=4, n_kv_heads=3)


def test_hidden_dim_follows_llama2cs_rule():
    assert llama_hidden_dim(128, None, 32) == 352  # 4 * 128 = 512, 2/3 of it 341, up to a multiple of 32
    assert llama_hidden_dim(288, None, 32) == 768  # llama2.c's stories15M
    assert llama_hidden_dim(4096, None, 256) == 11008  # Llama 2 7B
    assert llama_hidden_dim(128, 100, 32) == 100
    ff = FeedForward(128, None, 32, 0.0)
    assert ff.w1.weight.shape == (352, 128) and ff.w2.weight.shape == (128, 352) and ff.w3.weight.shape == (352, 128)


def test_state_dict_names_and_tying_are_llama2cs():
    theirs, ours = twin_and_ours(np.float32)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.output.weight is ours.tok_embeddings.weight
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    assert "freqs_cos" not in ours.state_dict()


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float64, 1e-10)])
def test_logits_and_gradients_match_llama2cs_model(dtype, tol):
    """The same state dict, the same tokens: logits, loss and the gradient of
    every parameter agree (on the scale of each array)."""
    theirs, ours = twin_and_ours(dtype)
    tokens = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (3, SMALL["max_seq_len"]))
    targets = np.roll(tokens, -1, axis=1)
    logits = ours(tokens)
    loss = F.cross_entropy(logits.reshape(-1, SMALL["vocab_size"]), targets.reshape(-1))
    loss.backward()
    t_logits = theirs(torch.tensor(tokens))
    t_loss = torch.nn.functional.cross_entropy(t_logits.view(-1, SMALL["vocab_size"]), torch.tensor(targets).view(-1))
    t_loss.backward()
    assert logits.dtype == dtype

    def close(a, b, what):
        scale = max(1.0, float(np.abs(b).max()))
        assert np.abs(a - b).max() <= tol * scale, f"{what}: {np.abs(a - b).max():.1e}"
    close(logits.data, t_logits.detach().numpy(), "logits")
    close(np.array(loss.item()), np.array(t_loss.item()), "loss")
    params = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        close(params[name].grad.data, p.grad.numpy(), name)


def test_kv_cache_generation_is_exact_against_the_uncached_path():
    """Greedy and sampled continuations, cached against uncached, through a
    window restart (the prompt plus 30 ids > max_seq_len 16); the logits of
    one cached step against the full forward's last position."""
    _, ours = twin_and_ours(np.float64)
    prompt = np.random.default_rng(1).integers(0, SMALL["vocab_size"], (2, 5))
    for temperature in (0.0, 0.9):
        cached = ours.generate(prompt, 30, temperature=temperature, generator=np.random.default_rng(3))
        uncached = ours.generate(prompt, 30, temperature=temperature, generator=np.random.default_rng(3),
                                 use_cache=False)
        np.testing.assert_array_equal(cached, uncached)
    ids = np.random.default_rng(2).integers(0, SMALL["vocab_size"], (2, 11))
    caches = ours._new_caches(2, 16)
    generation.llama_step(ours, ids[:, :7], caches)  # prefill positions 0..6
    for t in range(7, 11):  # then one position at a time: the rotary angles continue from the cache
        step = generation.llama_step(ours, ids[:, t:t + 1], caches)
        np.testing.assert_allclose(step, ours(ids[:, :t + 1]).data[:, -1], rtol=1e-12, atol=1e-12)


def test_kv_cache_keeps_only_the_shared_heads():
    """n_kv_heads = 2 of 4 heads: the cache is half a full-heads cache (and a
    quarter with one shared head), yet gives the model's logits."""
    for n_kv, factor in ((2, 2), (1, 4), (4, 1)):
        _, ours = twin_and_ours(np.float64, n_kv_heads=n_kv)
        caches = ours._new_caches(3, 16)
        full_heads = 3 * SMALL["n_heads"] * 16 * (SMALL["dim"] // SMALL["n_heads"])
        assert all(c.keys.shape == (3, n_kv, 16, 8) and c.keys.size * factor == full_heads for c in caches)
        ids = np.arange(18).reshape(3, 6) % SMALL["vocab_size"]
        np.testing.assert_allclose(generation.llama_step(ours, ids, caches), ours(ids).data[:, -1],
                                   rtol=1e-12, atol=1e-12)


def test_llama_trains_the_same_through_the_reference_ops():
    """The fused graph holds the new fused ops, the reference graph none; the
    loss and gradients agree to rounding (float64)."""
    results = []
    for reference in (False, True):
        tg.manual_seed(0)
        model = Llama(LlamaConfig(**SMALL)).double()
        tokens = np.arange(2 * 9).reshape(2, 9) % SMALL["vocab_size"]
        with tg.reference_ops(reference):
            loss = F.cross_entropy(model(tokens).reshape(-1, SMALL["vocab_size"]), np.roll(tokens, -1).reshape(-1))
        names = ops_in_graph(loss)
        loss.backward()
        results.append((loss.item(), {n: p.grad.data for n, p in model.named_parameters()}, names))
    (loss_f, grads_f, ops_f), (loss_r, grads_r, ops_r) = results
    fused = {"RMSNormOp", "RotaryOp", "LinearOp", "ScaledDotProductAttention", "CrossEntropy"}
    assert ops_f >= fused and not ops_r & fused, (sorted(ops_f), sorted(ops_r))
    assert loss_r == pytest.approx(loss_f, rel=1e-12)
    for name in grads_f:
        np.testing.assert_allclose(grads_r[name], grads_f[name], rtol=1e-9, atol=1e-12 * np.abs(grads_f[name]).max())


def test_bad_input_names_the_model():
    model = Llama(LlamaConfig(**SMALL))
    with pytest.raises(tg.ShapeError, match="Llama.*max_seq_len 16"):
        model(np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match=r"Llama: token ids must be in \[0, 13\)"):
        model(np.array([[13]]))
    with pytest.raises(ValueError, match="Llama.generate: temperature"):
        model.generate(np.array([1]), 3, temperature=-1)


# ------------------------------------------------- llama2.c's own code

LLAMA2C_COPY = Path(__file__).parent / "third_party" / "llama2c"
# sha256 of the copies of llama2.c (commit 350e04f) in tests/third_party/llama2c
LLAMA2C_SHA256 = {
    "model.py": "54f35dbd347100c0066da93dfdf9f19c2ec1e8758bfffcedbdfdb09d5c343e1f",
    "run.c": "9c4f2d5c6ae01b71726d1cc37530d71e60bff0ec7cc012565f16a43c1ca658bd",
}


def llama2c_file(name):
    """The path of `name` in llama2.c: in the checkout $LLAMA2C_DIR names if
    set, else in the unchanged copy in tests/third_party/llama2c."""
    root = os.environ.get("LLAMA2C_DIR")
    if not root:
        return LLAMA2C_COPY / name
    path = Path(root) / name
    if not path.is_file():
        pytest.fail(f"LLAMA2C_DIR={root} has no {name}: it should be a llama2.c checkout")
    return path


@pytest.mark.parametrize("name", sorted(LLAMA2C_SHA256))
def test_the_copies_of_llama2c_are_unchanged(name):
    """The tests below run llama2.c's own files: an edit to the copies would
    make them test our idea of llama2.c instead."""
    digest = hashlib.sha256((LLAMA2C_COPY / name).read_bytes()).hexdigest()
    assert digest == LLAMA2C_SHA256[name], f"tests/third_party/llama2c/{name} differs from llama2.c's"


def llama2c_model_py():
    """llama2.c's model.py, imported as a module (it needs torch and numpy only)."""
    path = llama2c_file("model.py")
    spec = importlib.util.spec_from_file_location("llama2c_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


def largest_differences(ours, theirs, tokens):
    """{what: max |ours - theirs| / max |theirs|} for the logits, the loss and the
    gradient of every parameter, for the cross-entropy of next-token prediction
    (llama2.c's loss: Transformer.forward with targets)."""
    targets = np.roll(tokens, -1, axis=1)
    vocab = ours.config.vocab_size
    logits = ours(tokens)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-1)
    loss.backward()
    t_logits = theirs(torch.tensor(tokens), torch.tensor(targets))  # with targets: the logits of every position
    theirs.last_loss.backward()
    pairs = {"logits": (logits.data, t_logits.detach().numpy()),
             "loss": (np.array(loss.item()), np.array(theirs.last_loss.item()))}
    params = dict(ours.named_parameters())
    pairs.update({name: (params[name].grad.data, p.grad.numpy()) for name, p in theirs.named_parameters()})
    assert set(params) == {name for name, _ in theirs.named_parameters()}
    return {what: float(np.abs(a - b).max() / np.abs(b).max()) for what, (a, b) in pairs.items()}


@pytest.mark.parametrize("n_kv_heads", [2, 4])
def test_logits_and_gradients_match_llama2cs_own_model_py(n_kv_heads):
    """llama2.c's model.py itself (not our twin): the same small model in
    float32, its state_dict loaded into ours unchanged, gives the same logits
    and the same gradient of every parameter, each to 1e-5 of the array's
    largest value. (In float64 only our twin agrees to 1e-10: llama2.c's
    model.py computes RMSNorm and the rotation in float32 even then.)"""
    model_py = llama2c_model_py()
    config = LlamaConfig(**{**SMALL, "n_kv_heads": n_kv_heads})
    torch.manual_seed(0)
    theirs = model_py.Transformer(model_py.ModelArgs(**dataclasses.asdict(config)))
    with torch.no_grad():  # random weights on the scale of trained ones, norm weights too
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1 else 0.0))
    ours = Llama(config)
    ours.load_state_dict(theirs.state_dict())  # strict, unchanged: llama2.c's names, tied output
    assert ours.output.weight is ours.tok_embeddings.weight
    tokens = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (3, SMALL["max_seq_len"]))
    differences = largest_differences(ours, theirs, tokens)
    worst = max(differences, key=differences.get)
    assert differences[worst] <= 1e-5, f"{worst}: {differences[worst]:.1e}"


def test_llama2cs_run_c_generates_our_greedy_tokens(tmp_path, capsys):
    """llama2.c's run.c, compiled here, on an `export --to llama2c` of a small
    random Llama run (weights large enough that greedy decoding does not
    just repeat a character): greedy (-t 0), with and without a prompt, it
    prints the characters of our own greedy generation up to its stop and
    one newline. Its stops, both seen: the first newline generated (id 1,
    run.c's BOS; the newline's embedding row is scaled up in a second
    export to make it likely), or max_seq_len positions."""
    run_c = llama2c_file("run.c")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: it compiles llama2.c's run.c")
    binary = tmp_path / "llama2c-run"
    subprocess.run([gcc, "-O2", "-o", str(binary), str(run_c), "-lm"], check=True, capture_output=True)
    from tinygrad_attn.cli import main
    from tinygrad_attn.train import load_run

    from .test_train import quiet, tiny
    trainer = quiet(tiny(tmp_path, "charlm", arch="llama", seq_len=48, kv_heads=1))
    rng = np.random.default_rng(1)
    for p in trainer.model.parameters():
        p.data += rng.normal(0.0, 1.0, p.shape).astype(p.data.dtype)
    trainer.save_checkpoint()
    newline = load_run(tmp_path / "run")[1].tokenizer.chars.index("\n")
    stops, compared = set(), 0
    for newline_scale in (1.0, 1.5):
        trainer.model.tok_embeddings.weight.data[newline] *= newline_scale
        trainer.save_checkpoint()
        assert main(["export", str(tmp_path / "run"), "--to", "llama2c", str(tmp_path / "m.bin"), "--overwrite"]) == 0
        capsys.readouterr()
        model, meta = load_run(tmp_path / "run")
        steps = model.config.max_seq_len
        for prompt in (None, "First", "Spe", "d"):
            flags = [] if prompt is None else ["-i", prompt]
            result = subprocess.run([str(binary), str(tmp_path / "m.bin"), "-z", str(tmp_path / "m.tokenizer.bin"),
                                     "-t", "0", "-n", str(steps)] + flags, capture_output=True, text=True, check=True)
            # run.c reads newline (its BOS), then with a prompt a space (the dummy prefix) and the prompt
            context = "\n" + ("" if prompt is None else " " + prompt)
            ids = model.generate(meta.encode(context), steps + 1 - len(context), temperature=0.0)
            generated = meta.decode(ids)[len(context):]
            line = generated.split("\n")[0]
            stops.add("newline" if "\n" in generated else "max_seq_len")
            # the choices up to run.c's stop are clear: no near tie that float rounding could flip
            logits = np.sort(model(ids[None, :-1]).data[0, len(context) - 1:][:len(line) + 1], axis=-1)
            assert (logits[:, -1] - logits[:, -2]).min() > 1e-3, (prompt, logits[:, -1] - logits[:, -2])
            if prompt is None and line.startswith(" "):
                line = line[1:]  # run.c's decode drops a space that follows BOS
            expected = ("" if prompt is None else prompt) + line + "\n"
            assert result.stdout == expected, (newline_scale, prompt, result.stdout, generated)
            compared += len(line)
    assert stops == {"newline", "max_seq_len"} and compared >= 150  # enough to mean something

"""--arch llama on the command line (train, sample, resume, export), and the
llama2.c export: the model file in export.py's version-0 layout and the
tokenizer file that llama2.c's run.c reads, checked with our own reader.

(That run.c itself runs an exported model and gives our greedy tokens is
tests/test_llama.py's test_llama2cs_run_c_generates_our_greedy_tokens,
on the copy of run.c in tests/third_party/llama2c, compiled with gcc.)"""
import struct

import numpy as np
import pytest

from tinygrad_attn import llama2c
from tinygrad_attn.models import GPT, GPTConfig, Llama, LlamaConfig
from tinygrad_attn.train import TrainConfig, load_run
from tinygrad_attn.train.config import ConfigError

from .test_cli import TINY, assert_user_error, run, text_file  # noqa: F401  (text_file: a fixture)

LLAMA = ["--task", "charlm", "--arch", "llama", "--seq-len", "16", "--no-plots"] + TINY


def test_llama_train_sample_resume_and_export(tmp_path, capsys, text_file):  # noqa: F811
    out = tmp_path / "lm"
    status, stdout, err = run(["train", "--text", str(text_file), "--steps", "4", "--eval-every", "2",
                               "--out", str(out), "--kv-heads", "1"] + LLAMA, capsys)
    assert status == 0, err
    assert "model: Llama 1 blocks" in stdout and "1 key/value heads" in stdout and "val_loss" in stdout
    model, info = load_run(out)
    assert isinstance(model, Llama) and model.config.n_kv_heads == 1 and info.config.arch == "llama"
    status, stdout, err = run(["sample", str(out), "--prompt", "First", "--length", "10", "--seed", "1"], capsys)
    assert status == 0 and stdout.startswith("First"), err
    status, stdout, err = run(["resume", str(out), "--steps", "6"], capsys)
    assert status == 0 and "step 6/6" in stdout, err
    status, _, err = run(["export", str(out), "--to", "torch", str(tmp_path / "lm.safetensors")], capsys)
    assert status == 0, err
    status, stdout, err = run(["export", str(out), "--to", "llama2c", str(tmp_path / "lm.bin")], capsys)
    assert status == 0 and "lm.tokenizer.bin" in stdout, err
    assert_user_error(run(["export", str(out), "--to", "llama2c", str(tmp_path / "lm.bin")], capsys),
                      "already exists")


def test_gpt_runs_do_not_export_to_llama2c(tmp_path, capsys, text_file):  # noqa: F811
    out = tmp_path / "gpt"
    status, _, err = run(["train", "--task", "charlm", "--text", str(text_file), "--seq-len", "16", "--steps", "2",
                          "--eval-every", "2", "--out", str(out), "--no-plots"] + TINY, capsys)
    assert status == 0, err
    assert_user_error(run(["export", str(out), "--to", "llama2c", str(tmp_path / "g.bin")], capsys),
                      "llama2.c runs Llama models")


def test_llama_settings_and_their_errors(tmp_path, text_file):  # noqa: F811
    c = TrainConfig(task="charlm", arch="llama", text=str(text_file)).resolved()
    assert (c.d_model, c.layers, c.heads, c.kv_heads, c.ffn, c.seq_len, c.bias, c.gelu) == \
        (128, 4, 4, 2, 352, 64, None, None)  # nanoGPT's CPU size, llama2.c's SwiGLU rule, half the heads shared
    assert TrainConfig(task="charlm", text=str(text_file)).resolved().arch == "gpt"
    assert TrainConfig.from_json(TrainConfig(task="charlm", text="t").to_json().replace('"arch": null, ', "")
                                 ).arch == "gpt"  # a checkpoint from before --arch trained a GPT
    for changes, message in ((dict(kv_heads=3), "--kv-heads must be a positive integer dividing --heads 4"),
                             (dict(bias=True), "options of --arch gpt"),
                             (dict(d_model=12, heads=4), "even head size"),
                             (dict(arch="mamba"), "--arch must be one of gpt, llama")):
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**{"task": "charlm", "arch": "llama", "text": str(text_file), **changes}).resolved()
    with pytest.raises(ConfigError, match="--kv-heads is an option of --arch llama"):
        TrainConfig(task="charlm", text=str(text_file), kv_heads=2).resolved()
    with pytest.raises(ConfigError, match="options of --task charlm"):
        TrainConfig(task="copy", arch="llama").resolved()


def small_llama(**changes):
    config = LlamaConfig(**{**dict(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=6, multiple_of=8,
                                   max_seq_len=8), **changes})
    return Llama(config)


def test_model_file_has_export_pys_version_0_layout(tmp_path):
    """Header, then every array in export.py's order, nothing else; the
    newline moved to id 1 (run.c's BOS) with its embedding row."""
    model, chars = small_llama(), "\n !abc"
    order = llama2c.export(model, chars, tmp_path / "m.bin", tmp_path / "t.bin")
    assert chars[order[1]] == "\n" and sorted(order) == list(range(6))
    raw = (tmp_path / "m.bin").read_bytes()
    assert struct.unpack_from("<7i", raw) == (16, 48, 2, 4, 2, 6, 8)  # positive vocab_size: tied output
    header, arrays = llama2c.read_model(tmp_path / "m.bin")
    assert header["shared"] and len(raw) == 28 + 4 * sum(a.size for a in arrays.values())
    np.testing.assert_array_equal(arrays["tok_embeddings"], model.tok_embeddings.weight.data[order])
    for i, layer in enumerate(model.layers):
        np.testing.assert_array_equal(arrays["attention.wk"][i], layer.attention.wk.weight.data)
        np.testing.assert_array_equal(arrays["feed_forward.w2"][i], layer.feed_forward.w2.weight.data)
        np.testing.assert_array_equal(arrays["ffn_norm"][i], layer.ffn_norm.weight.data)
    np.testing.assert_array_equal(arrays["norm"], model.norm.weight.data)
    np.testing.assert_array_equal(arrays["freqs_sin"], model.freqs_sin.data)
    # the file's model is ours with the vocabulary reordered: the same logits, reordered
    copy = small_llama()
    copy.load_state_dict({**{k: v for k, v in model.state_dict().items()},
                          "tok_embeddings.weight": arrays["tok_embeddings"], "output.weight": arrays["tok_embeddings"]})
    ids = np.array([[0, 3, 1, 5, 2]])
    np.testing.assert_allclose(copy(np.argsort(order)[ids]).data, model(ids).data[..., order], rtol=1e-6, atol=1e-6)


def test_untied_output_gets_a_negative_vocab_size(tmp_path):
    model = small_llama()
    model.output.weight = type(model.output.weight)(model.output.weight.data * 2)  # untie
    llama2c.write_model(model, tmp_path / "m.bin")
    header, arrays = llama2c.read_model(tmp_path / "m.bin")
    assert struct.unpack_from("<7i", (tmp_path / "m.bin").read_bytes())[5] == -6 and not header["shared"]
    np.testing.assert_array_equal(arrays["output"], model.output.weight.data)


def test_tokenizer_file_is_run_cs(tmp_path):
    chars = "\n !aé€"
    order = llama2c.llama2c_ids(chars)
    llama2c.write_tokenizer(chars, tmp_path / "t.bin", order)
    max_len, pieces = llama2c.read_tokenizer(tmp_path / "t.bin", len(chars))
    assert max_len == 3  # "€" is three UTF-8 bytes
    assert [p.decode() for _, p in pieces] == [chars[i] for i in order] and pieces[1][1] == b"\n"
    assert all(score == 0.0 for score, _ in pieces)
    with pytest.raises(ValueError, match="no space"):
        llama2c.write_tokenizer("\nab", tmp_path / "x.bin")
    with pytest.raises(ValueError, match="NUL"):
        llama2c.write_tokenizer("\0 a", tmp_path / "x.bin")
    with pytest.raises(ValueError, match="eps = 1e-5"):
        llama2c.write_model(small_llama(norm_eps=1e-6), tmp_path / "x.bin")
    with pytest.raises(TypeError, match="Llama models"):
        llama2c.export(GPT(GPTConfig(vocab_size=6, n_layer=1, n_embd=8, n_head=2)), chars, tmp_path / "a", tmp_path / "b")


def test_a_failing_write_leaves_the_earlier_files_intact(tmp_path, monkeypatch):
    """Each file goes through a temporary file renamed over its path; the
    export writes both temporary files before renaming either, so a failure
    leaves neither file half-written nor the pair mismatched."""
    import os
    model, chars = small_llama(), "\n !abc"
    paths = tmp_path / "m.bin", tmp_path / "m.tokenizer.bin"
    llama2c.export(model, chars, *paths)
    before = [p.read_bytes() for p in paths]

    def disk_full(fd):
        raise OSError(28, "No space left on device (simulated)")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="simulated"):
        llama2c.write_model(small_llama(dim=8), paths[0])
    with pytest.raises(OSError, match="simulated"):
        llama2c.write_tokenizer("\n xyz", paths[1])
    monkeypatch.undo()
    assert [p.read_bytes() for p in paths] == before and sorted(os.listdir(tmp_path)) == ["m.bin", "m.tokenizer.bin"]

    def interrupted(chars, order=None):  # the tokenizer's bytes fail after the model's are written
        yield b"\x01\x00\x00\x00"
        raise KeyboardInterrupt
    monkeypatch.setattr(llama2c, "_tokenizer_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llama2c.export(small_llama(dim=8), chars, *paths)
    monkeypatch.undo()
    assert [p.read_bytes() for p in paths] == before and sorted(os.listdir(tmp_path)) == ["m.bin", "m.tokenizer.bin"]
    llama2c.export(small_llama(dim=8), chars, *paths)  # and a new export replaces both
    assert llama2c.read_model(paths[0])[0]["dim"] == 8 and llama2c.read_tokenizer(paths[1], 6)[1][1][1] == b"\n"

"""Using a trained run: `load_run` for inference, and `export --to torch`
into the PyTorch modules of examples/torch_models.py (loaded with
strict=True, outputs equal to ours)."""
import json

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn.cli import main
from tinygrad_attn.train import load_run, torch_state_dict

from .test_examples import load
from .test_train import quiet, tiny


def _run_dir(tmp_path, task, **changes):
    """A run directory whose checkpoint holds random weights (every
    parameter perturbed, so that biases are not all zero)."""
    trainer = quiet(tiny(tmp_path, task, **changes))
    rng = np.random.default_rng(1)
    for p in trainer.model.parameters():
        p.data += rng.normal(0.0, 0.1, p.shape).astype(p.data.dtype)
    trainer.save_checkpoint()
    return tmp_path / "run", trainer.model


def test_load_run_gives_the_model_in_eval_mode_and_its_vocabulary(tmp_path):
    out, trained = _run_dir(tmp_path, "charlm")
    model, meta = load_run(out)
    assert not model.training and not any(m.training for m in model.modules())
    assert meta.task == "charlm" and meta.step == 0 and meta.config.seq_len == 16
    assert meta.model_config == trained.config
    assert meta.decode(meta.encode("First Citizen")) == "First Citizen"
    ids = meta.encode("First")
    np.testing.assert_array_equal(model(ids[None]).data, trained.eval()(ids[None]).data)

    seq_dir = tmp_path / "seq"
    seq_dir.mkdir()
    out, _ = _run_dir(seq_dir, "reverse")
    model, meta = load_run(out / "checkpoint.safetensors")
    assert meta.task == "reverse" and type(model).__name__ == "Seq2SeqTransformer"
    assert meta.decode(np.concatenate([meta.encode([3, 1, 4]), [2]])) == [3, 1, 4]  # up to EOS
    assert meta.tokenizer.held_out_batch(2).src.shape == (2, 5)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _torch_logits(model, *inputs):
    import torch
    with torch.no_grad():
        return model(*(torch.as_tensor(np.asarray(x)) for x in inputs)).numpy()


@pytest.mark.parametrize("changes", [dict(), dict(bias=False, gelu="tanh"), dict(dropout=0.1, ffn=24)])
def test_a_charlm_run_exports_to_a_nanogpt_style_torch_gpt(tmp_path, capsys, torch, changes):
    out, _ = _run_dir(tmp_path, "charlm", **changes)
    target = tmp_path / "gpt.safetensors"
    assert main(["export", str(out), "--to", "torch", str(target)]) == 0
    assert "wrote" in capsys.readouterr().out
    model, meta = load_run(out)
    torch_models = load("torch_models")
    exported = torch_models.load_exported(str(target))  # load_state_dict(strict=True) inside
    assert type(exported).__name__ == "GPT" and not exported.training
    assert exported.transformer.wte.weight is exported.lm_head.weight  # tied, as ours
    ids = np.random.default_rng(0).integers(0, meta.model_config.vocab_size, size=(3, 16))
    np.testing.assert_allclose(_torch_logits(exported, ids), model(ids).data, rtol=1e-5, atol=1e-5)
    # the names are nanoGPT's
    assert "transformer.h.0.attn.c_attn.weight" in torch_state_dict(model)
    assert set(torch_state_dict(model)) == set(exported.state_dict())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # torch's encoder fast path
@pytest.mark.parametrize("changes", [dict(), dict(layers=2, vocab=7, min_seq_len=2)])
def test_a_seq2seq_run_exports_to_a_module_around_torch_transformer(tmp_path, torch, changes):
    out, _ = _run_dir(tmp_path, "copy", **changes)
    target = tmp_path / "seq2seq.safetensors"
    assert main(["export", str(out), "--to", "torch", str(target)]) == 0
    model, meta = load_run(out)
    exported = load("torch_models").load_exported(str(target))
    assert isinstance(exported.transformer, torch.nn.Transformer)
    batch = meta.tokenizer.held_out_batch(4)  # padded sequences when min_seq_len is set
    ours = model(batch.src, batch.tgt_in).data
    theirs = _torch_logits(exported, batch.src, batch.tgt_in)
    real = batch.tgt_in != 0  # positions that are not padding
    np.testing.assert_allclose(theirs[real], ours[real], rtol=1e-5, atol=1e-5)


def test_export_refuses_to_overwrite_a_file_unless_asked(tmp_path, capsys):
    out, _ = _run_dir(tmp_path, "copy")
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"something precious")
    assert main(["export", str(out), "--to", "torch", str(target)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already exists" in err and "--overwrite" in err
    assert target.read_bytes() == b"something precious"
    assert main(["export", str(out), "--to", "torch", str(target), "--overwrite"]) == 0
    state, metadata = tg.load(target, with_metadata=True)
    assert metadata["module"] == "Seq2SeqTransformer" and json.loads(metadata["config"])["vocab_size"] == 9
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "x.safetensors")]) == 2


def test_an_exported_file_names_its_run_but_holds_no_local_path(tmp_path):
    """A model file people share carries the run's name ("source"), not the
    absolute path of the machine it was made on (nor the user's name in it)."""
    out, _ = _run_dir(tmp_path, "copy")
    target = tmp_path / "model.safetensors"
    assert main(["export", str(out / "checkpoint.safetensors"), "--to", "torch", str(target)]) == 0
    _, metadata = tg.load(target, with_metadata=True)
    assert metadata["source"] == "run"  # the run directory's name
    raw = target.read_bytes()
    header = raw[8:8 + int.from_bytes(raw[:8], "little")].decode()
    assert str(tmp_path) not in header and str(tmp_path.resolve()) not in header
    from tinygrad_attn.train.run import run_name
    assert run_name(tmp_path / "elsewhere" / "best.safetensors") == "best.safetensors"


@pytest.mark.parametrize("to", ["torch", "llama2c"])
def test_export_never_writes_over_a_file_of_the_run_even_with_overwrite(tmp_path, capsys, to):
    """The checkpoint (by any name: the directory, the file, a link to it)
    and the run's other files are refused as the output, --overwrite or not:
    replacing them would destroy the run that sample and resume read."""
    out, _ = _run_dir(tmp_path, "charlm", arch="llama")
    checkpoint = out / "checkpoint.safetensors"
    (out / "metrics.json").write_text("{}")
    (tmp_path / "link.safetensors").symlink_to(checkpoint)
    (tmp_path / "hard.safetensors").hardlink_to(checkpoint)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    targets = [checkpoint, out / ".." / "run" / "checkpoint.safetensors", tmp_path / "link.safetensors",
               tmp_path / "hard.safetensors", out / "metrics.json", out / "metrics.jsonl"]
    for source in (out, checkpoint):
        for target in targets:
            for extra in ([], ["--overwrite"]):
                status, err = _cli(["export", str(source), "--to", to, str(target)] + extra, capsys)
                assert status == 2 and "error:" in err and "Traceback" not in err, (target, err)
                assert "the run" in err and str(target) in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not (out / "metrics.jsonl").exists()  # refused by name too: the run writes it
    assert load_run(out)[1].step == 0  # the run still loads


def test_llama2c_export_refuses_a_tokenizer_path_on_a_file_of_the_run(tmp_path, capsys):
    out, _ = _run_dir(tmp_path, "charlm", arch="llama")
    checkpoint = out / "checkpoint.safetensors"
    (tmp_path / "m.tokenizer.bin").symlink_to(checkpoint)  # m.bin's tokenizer would be the checkpoint
    before = checkpoint.read_bytes()
    status, err = _cli(["export", str(out), "--to", "llama2c", str(tmp_path / "m.bin"), "--overwrite"], capsys)
    assert status == 2 and "m.tokenizer.bin" in err and "the run" in err, err
    assert checkpoint.read_bytes() == before and not (tmp_path / "m.bin").exists()


def _cli(argv, capsys):
    status = main(argv)
    _, err = capsys.readouterr()
    return status, err

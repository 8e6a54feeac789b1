"""The command line: help, argument and user errors (one line, exit status
2, no traceback), and small end-to-end runs of train, resume, sample,
decode and Ctrl-C."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn.cli import build_parser, main
from tinygrad_attn.train import Trainer, read_checkpoint

from .test_train import TEXT

TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--ffn", "32", "--batch-size", "8",
        "--warmup", "1", "--eval-size", "16", "--no-progress"]


def run(argv, capsys):
    """(exit status, stdout, stderr) of main(argv); argparse errors exit via SystemExit."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def assert_user_error(result, *fragments):
    status, _, err = result
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- help
def test_help_documents_every_option_with_its_default(capsys):
    parser = build_parser()
    for name, sub in parser.commands.items():
        text = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.option_strings == ["-h", "--help"]:
                continue
            assert action.option_strings[-1] in text
            assert action.help, f"{name} {action.option_strings} has no help"
            if action.nargs != 0:  # options taking a value say what happens without them
                assert "default" in action.help, f"{name} {action.option_strings}: no default in its help"
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--task", "--text", "--layers", "--d-model", "--heads", "--ffn", "--dropout", "--steps",
                 "--batch-size", "--lr", "--warmup", "--seq-len", "--vocab", "--eval-every", "--seed",
                 "--out", "--log-grad-norms", "--schedule", "--weight-decay", "--grad-clip"):
        assert flag in out
    assert "charlm: 128" in out  # task-dependent defaults are spelled out


def test_every_training_setting_has_an_option():
    from dataclasses import fields
    from tinygrad_attn.train import TrainConfig
    options = {a.dest for a in build_parser().commands["train"]._actions}
    assert {f.name for f in fields(TrainConfig)} <= options


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, fragment", [
    ([], "COMMAND"),
    (["fly"], "invalid choice"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--steps", "ten"], "--steps"),
    (["train", "--lr", "-1"], "--lr"),
    (["train", "--seed", "-1"], "--seed"),
    (["sample", "ckpt", "--seed", "-3"], "--seed"),
    (["train", "--task", "translate"], "--task"),
    (["train", "--bogus"], "unrecognized arguments: --bogus"),
    (["sample"], "CHECKPOINT"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, fragment):
    assert_user_error(run(argv, capsys), fragment)


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--d-model", "30", "--heads", "4"], "divisible"),
    (["train", "--task", "charlm"], "needs --text"),
    (["train", "--steps", "10", "--warmup", "10"], "smaller than --steps"),
    (["train", "--task", "charlm", "--text", "/no/such/file.txt"], "not found"),
    (["resume", "/no/such/checkpoint.safetensors"], "not found"),
])
def test_bad_settings_and_missing_files_exit_2(capsys, argv, fragment):
    assert_user_error(run(argv, capsys), fragment)


def test_an_output_directory_that_cannot_be_made_exits_2(tmp_path, capsys):
    taken = tmp_path / "a_file"
    taken.write_text("")
    assert_user_error(run(["train", "--out", str(taken)] + TINY, capsys), "--out", "output directory")


def test_a_text_that_is_not_utf8_exits_2(tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    assert_user_error(run(["train", "--task", "charlm", "--text", str(path)], capsys), "not UTF-8")


def test_files_that_are_not_our_checkpoints_exit_2(tmp_path, capsys):
    other = tmp_path / "other.safetensors"
    tg.save({"w": np.ones(2)}, other)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a checkpoint at all")
    for command in ("resume", "sample", "decode"):
        assert_user_error(run([command, str(other)], capsys), "not a tinygrad_attn training checkpoint")
        assert_user_error(run([command, str(junk)], capsys), "safetensors")
    assert_user_error(run(["decode", str(tmp_path)], capsys), "without a checkpoint.safetensors")


def test_module_entry_point_in_a_subprocess(tmp_path):
    """`python -m tinygrad_attn`: help works, an error is one line and status 2."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    ok = subprocess.run([sys.executable, "-m", "tinygrad_attn", "--help"], capture_output=True,
                        text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "train" in ok.stdout and "python -m tinygrad_attn" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "tinygrad_attn", "resume", str(tmp_path / "nope")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not found" in bad.stderr
    # matplotlib and tqdm are imported only when a run needs them
    lazy = subprocess.run([sys.executable, "-c", "import sys, tinygrad_attn.cli, tinygrad_attn.train; "
                           "print(sorted({'matplotlib', 'tqdm'} & set(sys.modules)))"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert lazy.stdout.strip() == "[]", lazy.stderr


def test_console_script_points_at_main():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    module, _, name = pyproject["project"]["scripts"]["tinygrad-attn"].partition(":")
    assert getattr(importlib.import_module(module), name) is main


# --------------------------------------------------------------------------- end to end
def test_train_resume_decode_end_to_end(tmp_path, capsys):
    out = tmp_path / "copy"
    status, stdout, err = run(["train", "--task", "reverse", "--vocab", "5", "--seq-len", "4",
                               "--steps", "6", "--eval-every", "3", "--out", str(out),
                               "--log-grad-norms"] + TINY, capsys)
    assert status == 0, err
    assert "step 3/6" in stdout and "exact_match" in stdout and "prediction" in stdout
    assert (out / "checkpoint.safetensors").exists() and (out / "loss.png").stat().st_size > 0
    assert sorted(os.listdir(out / "attention")) == [
        "decoder.0.cross_attn.png", "decoder.0.self_attn.png", "encoder.0.self_attn.png"]
    steps = [json.loads(line)["step"] for line in open(out / "grad_norms.jsonl")]
    assert steps == [1, 3, 6]
    assert json.load(open(out / "metrics.json"))["step"] == 6

    status, stdout, err = run(["resume", str(out), "--steps", "9", "--no-progress", "--no-plots"], capsys)
    assert status == 0, err
    assert "resuming at step 6" in stdout and "step 9/9" in stdout
    _, metadata = read_checkpoint(out / "checkpoint.safetensors")
    assert metadata["step"] == "9"

    status, stdout, err = run(["decode", str(out / "checkpoint.safetensors"), "--input", "3 1 4 1",
                               "--input", "0,2,2,4"], capsys)
    assert status == 0, err
    assert "input      3 1 4 1" in stdout and "expected   1 4 1 3" in stdout
    assert stdout.count("prediction") == 2 and "/2 right" in stdout
    status, stdout, _ = run(["decode", str(out), "--num-examples", "3"], capsys)
    assert status == 0 and stdout.count("prediction") == 3

    assert_user_error(run(["decode", str(out), "--input", "3 1 9"], capsys), "0..4")
    assert_user_error(run(["decode", str(out), "--input", "a b"], capsys), "integers")
    assert_user_error(run(["sample", str(out)], capsys), "needs a charlm checkpoint")


def test_charlm_train_and_sample(tmp_path, capsys, text_file):
    out = tmp_path / "lm"
    status, stdout, err = run(["train", "--task", "charlm", "--text", str(text_file), "--seq-len", "16",
                               "--steps", "4", "--eval-every", "2", "--out", str(out),
                               "--no-plots"] + TINY, capsys)
    assert status == 0, err
    assert "val_loss" in stdout and "sample" in stdout
    status, stdout, err = run(["sample", str(out), "--prompt", "First", "--length", "20", "--seed", "1",
                               "--top-k", "5", "--temperature", "0.5"], capsys)
    assert status == 0, err
    assert stdout.startswith("First") and len(stdout.rstrip("\n")) >= len("First")
    status, again, _ = run(["sample", str(out), "--prompt", "First", "--length", "20", "--seed", "1",
                            "--top-k", "5", "--temperature", "0.5"], capsys)
    assert again == stdout  # the same seed, the same sample
    status, stdout, _ = run(["sample", str(out), "--num-samples", "2", "--length", "5"], capsys)
    assert status == 0 and stdout.count("--- sample") == 2
    assert_user_error(run(["sample", str(out), "--prompt", "Zebra€"], capsys), "not in the vocabulary")
    assert_user_error(run(["decode", str(out)], capsys), "needs a copy/reverse/sort checkpoint")


def test_ctrl_c_during_train_saves_and_exits_130(tmp_path, capsys, monkeypatch):
    original = Trainer.train_step

    def interrupted_at_step_2(self):
        result = original(self)
        if self.step == 2:
            raise KeyboardInterrupt  # as if Ctrl-C arrived right after step 2
        return result

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_step_2)
    out = tmp_path / "run"
    status, stdout, _ = run(["train", "--steps", "6", "--eval-every", "3", "--vocab", "5", "--seq-len", "4",
                             "--out", str(out)] + TINY, capsys)
    assert status == 130
    assert "interrupted: saved step 2" in stdout and "resume" in stdout
    _, metadata = read_checkpoint(out / "checkpoint.safetensors")
    assert metadata["step"] == "2"
    monkeypatch.setattr(Trainer, "train_step", original)
    status, stdout, _ = run(["resume", str(out), "--no-progress", "--no-plots"], capsys)
    assert status == 0 and "step 6/6" in stdout

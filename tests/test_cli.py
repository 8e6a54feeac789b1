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
    # an interrupted run also leaves its metrics and loss curve
    summary = json.load(open(out / "metrics.json"))
    assert summary["status"] == "interrupted" and summary["step"] == 2 and len(summary["history"]["train"]) == 2
    assert (out / "loss.png").stat().st_size > 0
    monkeypatch.setattr(Trainer, "train_step", original)
    status, stdout, _ = run(["resume", str(out), "--no-progress", "--no-plots"], capsys)
    assert status == 0 and "step 6/6" in stdout


# --------------------------------------------------------------------------- run directories
def _step_of(directory):
    _, metadata = read_checkpoint(directory)
    return int(metadata["step"])


COPY = ["--vocab", "5", "--seq-len", "4"] + TINY


def test_train_refuses_a_directory_holding_a_run_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", "--steps", "4", "--eval-every", "2", "--out", str(out)] + COPY, capsys)[0] == 0
    (out / "notes.txt").write_text("mine")
    (out / "attention" / "my_figure.png").write_bytes(b"not ours")
    before = (out / "checkpoint.safetensors").read_bytes()
    assert_user_error(run(["train", "--steps", "2", "--out", str(out)] + COPY, capsys),
                      str(out), "already holds a run", "--overwrite")
    assert (out / "checkpoint.safetensors").read_bytes() == before  # untouched

    status, _, err = run(["train", "--steps", "2", "--out", str(out), "--overwrite", "--no-plots"] + COPY,
                         capsys)
    assert status == 0, err
    assert _step_of(out) == 2
    # the old run's plots are gone (this run wrote none); the user's files stay
    assert not (out / "loss.png").exists() and not (out / "attention" / "encoder.0.self_attn.png").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "attention" / "my_figure.png").exists()
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl")
            if json.loads(line)["type"] == "train"] == [1, 2]


def test_resume_writes_into_the_run_it_resumes_whatever_the_current_directory(tmp_path, capsys,
                                                                               monkeypatch):
    """A copied run, resumed from elsewhere, does not write over the original."""
    import shutil
    monkeypatch.chdir(tmp_path)
    assert run(["train", "--steps", "4", "--eval-every", "2", "--out", "runs/a"] + COPY, capsys)[0] == 0
    shutil.copytree(tmp_path / "runs" / "a", tmp_path / "copies" / "b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    status, stdout, err = run(["resume", str(tmp_path / "copies" / "b"), "--steps", "6", "--no-plots",
                               "--no-progress"], capsys)
    assert status == 0, err
    assert _step_of(tmp_path / "copies" / "b") == 6
    assert _step_of(tmp_path / "runs" / "a") == 4
    assert not (elsewhere / "runs").exists()
    steps = [json.loads(line)["step"] for line in open(tmp_path / "copies" / "b" / "metrics.jsonl")
             if json.loads(line)["type"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # the history so far, then the new steps, once each

    # an explicit --out is used, but not to write over another run
    status, _, err = run(["resume", str(tmp_path / "copies" / "b"), "--steps", "8", "--out",
                          str(tmp_path / "c"), "--no-plots"], capsys)
    assert status == 0, err
    assert _step_of(tmp_path / "c") == 8 and _step_of(tmp_path / "copies" / "b") == 6
    assert_user_error(run(["resume", str(tmp_path / "c"), "--steps", "9", "--out", str(tmp_path / "runs" / "a")],
                          capsys), "already holds a run", "--overwrite")
    assert _step_of(tmp_path / "runs" / "a") == 4


def test_a_charlm_run_finds_its_text_from_any_directory_and_resume_text_moves_it(tmp_path, capsys,
                                                                                monkeypatch, text_file):
    monkeypatch.chdir(tmp_path)
    lm = ["--task", "charlm", "--seq-len", "16", "--eval-every", "2", "--no-plots"] + TINY
    assert run(["train", "--text", "text.txt", "--steps", "2", "--out", "lm"] + lm, capsys)[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    status, _, err = run(["resume", str(tmp_path / "lm"), "--steps", "4", "--no-plots"], capsys)
    assert status == 0, err  # the stored path does not depend on where the command starts

    moved = tmp_path / "moved.txt"
    text_file.rename(moved)
    assert_user_error(run(["resume", str(tmp_path / "lm"), "--steps", "6"], capsys), "not found", "--text")
    status, _, err = run(["resume", str(tmp_path / "lm"), "--steps", "6", "--text", str(moved), "--no-plots"],
                         capsys)
    assert status == 0, err
    assert _step_of(tmp_path / "lm") == 6
    changed = tmp_path / "changed.txt"
    changed.write_text(TEXT.upper(), encoding="utf-8")
    assert_user_error(run(["resume", str(tmp_path / "lm"), "--steps", "8", "--text", str(changed)], capsys),
                      "not the text this checkpoint was trained on")
    copy_run = tmp_path / "copyrun"
    assert run(["train", "--steps", "2", "--out", str(copy_run), "--no-plots"] + COPY, capsys)[0] == 0
    assert_user_error(run(["resume", str(copy_run), "--steps", "3", "--text", str(moved)], capsys),
                      "--text is for charlm")


def test_a_diverging_run_stops_with_status_1_and_keeps_its_last_finite_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    status, stdout, err = run(["train", "--lr", "1e6", "--steps", "30", "--eval-every", "1", "--out", str(out),
                               "--no-plots"] + COPY, capsys)
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "diverged" in lines[0] and "--lr" in lines[0] and "Traceback" not in err
    arrays, metadata = read_checkpoint(out)
    kept = int(metadata["step"])
    assert 1 <= kept < 30 and f"checkpoint of step {kept}" in lines[0]
    assert all(np.isfinite(a).all() for name, a in arrays.items() if name.startswith("model."))
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert records[-1]["type"] == "diverged" and records[-1]["step"] > kept
    assert json.load(open(out / "metrics.json"))["status"] == "diverged"


def test_validation_happens_before_training_with_option_names(tmp_path, capsys):
    out = tmp_path / "run"
    assert_user_error(run(["train", "--vocab", "1", "--out", str(out)] + TINY, capsys), "--vocab 1", "--seq-len")
    tiny_text = tmp_path / "tiny.txt"
    tiny_text.write_text("To be, or not to be: that is the question.", encoding="utf-8")
    assert_user_error(run(["train", "--task", "charlm", "--text", str(tiny_text), "--out", str(out)] + TINY,
                          capsys), "--seq-len 64", "--text")
    assert_user_error(run(["train", "--no-bias", "--out", str(out)] + TINY, capsys), "--bias", "charlm")
    assert not out.exists()  # nothing was started


def test_decode_says_which_symbol_is_out_of_range(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", "--steps", "2", "--out", str(out), "--no-plots"] + COPY, capsys)[0] == 0
    assert_user_error(run(["decode", str(out), "--input", "-1 2"], capsys), "0..4", "got -1")
    assert_user_error(run(["decode", str(out), "--input", "1 x"], capsys), "integers")


def test_help_puts_every_option_in_a_named_group():
    parser = build_parser()
    for name, sub in parser.commands.items():
        loose = [a.option_strings for a in sub._optionals._group_actions if a.option_strings != ["-h", "--help"]]
        if name in ("train", "resume"):
            assert loose == [], f"{name}: {loose} outside the option groups"


def test_bias_gelu_beta2_and_decay_options_reach_the_run(tmp_path, capsys, text_file):
    out = tmp_path / "lm"
    status, stdout, err = run(["train", "--task", "charlm", "--text", str(text_file), "--seq-len", "16",
                               "--steps", "2", "--no-bias", "--gelu", "tanh", "--beta2", "0.95",
                               "--no-decay-embeddings", "--out", str(out), "--no-plots"] + TINY, capsys)
    assert status == 0, err
    assert "no bias, tanh GELU" in stdout and "beta2 0.95" in stdout
    _, metadata = read_checkpoint(out)
    model = json.loads(metadata["model"])
    config = json.loads(metadata["config"])
    assert (model["bias"], model["gelu"]) == (False, "tanh")
    assert (config["beta2"], config["decay_embeddings"]) == (0.95, False)


# --------------------------------------------------------------------------- signals and pipes
def _cli(args, **kwargs):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TINYGRAD_ATTN_PRECOMPILE": "0"}
    return subprocess.Popen([sys.executable, "-m", "tinygrad_attn"] + args, env=env, text=True, **kwargs)


def _wait_for(path, process, timeout=120):
    import time
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_sigterm_saves_a_checkpoint_metrics_and_plots_and_exits_143(tmp_path):
    import signal
    out = tmp_path / "run"
    process = _cli(["train", "--steps", "100000", "--eval-every", "2", "--out", str(out)] + COPY,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(out / "checkpoint.safetensors", process)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines() == ["python -m tinygrad_attn train: terminated"]  # no traceback
    assert "terminated (SIGTERM): saved step" in stdout
    step = _step_of(out)
    assert step >= 2
    summary = json.load(open(out / "metrics.json"))
    assert summary["status"] == "interrupted" and summary["step"] == step
    assert (out / "loss.png").stat().st_size > 0
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert records[-1] == {"type": "interrupted", "step": step, "by": "terminated (SIGTERM)"}
    assert [r["step"] for r in records if r["type"] == "train"] == list(range(1, step + 1))


def test_closing_the_output_pipe_saves_and_exits_without_a_traceback(tmp_path):
    out = tmp_path / "run"
    process = _cli(["train", "--steps", "300", "--eval-every", "1", "--out", str(out), "--no-plots"] + COPY,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = process.stdout.readline()
        for line in process.stdout:  # until training has started
            if line.startswith("step"):
                break
        process.stdout.close()  # like `| head`
        stderr = process.stderr.read()
        process.wait(timeout=120)
    finally:
        process.kill()
    assert first.startswith("task copy")
    assert process.returncode == 141, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    step = _step_of(out)
    assert step >= 1 and f"output closed; saved step {step}" in stderr


def test_warmup_compiles_the_kernels_of_a_step_with_a_progress_line(capsys):
    status, stdout, err = run(["warmup", "--dtype", "float32"], capsys)
    assert status == 0, err
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("compiling kernels (float32): 0/")
    assert lines[-1].endswith(")") and "kernel signatures ready in" in lines[-1]
    assert len(lines) == len(tg.kernels.KERNELS) + 1  # one line per kernel, then the summary


def test_threads_option_sets_the_threads_of_kernels_and_blas(tmp_path, capsys):
    from tinygrad_attn.kernels.threads import _blas
    try:
        status, _, err = run(["train", "--task", "copy", "--vocab", "5", "--seq-len", "3", "--steps", "2",
                              "--eval-every", "2", "--out", str(tmp_path / "run"), "--no-plots", "--threads", "1"]
                             + TINY, capsys)
        assert status == 0, err
        assert tg.get_num_threads() == 1 and all(c.get_num_threads() == 1 for c in _blas.controllers())
    finally:
        tg.set_num_threads(None)
    assert_user_error(run(["train", "--threads", "0"], capsys), "--threads")


def test_the_first_run_compiles_its_kernels_up_front_and_says_so(tmp_path):
    """With an empty kernel cache, `train` compiles its step's kernels before
    training (a helper process shares the work) and says so; the next run
    finds them cached and says nothing."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    argv = [sys.executable, "-m", "tinygrad_attn", "train", "--vocab", "5", "--seq-len", "3", "--steps", "2",
            "--eval-every", "2", "--no-plots", "--overwrite", "--out", str(tmp_path / "run")] + TINY
    first = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert "compiling kernels (first run" in first and "kernels in" in first
    second = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert "compiling" not in second and "step 2/2" in second

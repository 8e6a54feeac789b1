"""The training library: learning, exact resume, Ctrl-C checkpoints,
parameter groups, schedules, gradient-norm logs and configuration checks."""
import io
import json
import math
import os
import re
import shutil
import signal
import sys
from dataclasses import replace

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import nn, optim
from tinygrad_attn.checkpoint import CheckpointError
from tinygrad_attn.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from tinygrad_attn.train import (ConfigError, TrainConfig, Trainer, make_scheduler, read_checkpoint,
                                 weight_decay_groups)
from tinygrad_attn.train.signals import interrupts_deferred

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 8


def quiet(config, **kwargs):
    return Trainer(config, progress=False, log=lambda line: None, **kwargs)


def tiny(tmp_path, task="copy", **changes):
    """A few-second configuration of `task` writing to tmp_path."""
    values = dict(task=task, layers=1, d_model=16, heads=2, ffn=32, batch_size=8, steps=8, warmup=2,
                  eval_every=3, eval_size=16, out=str(tmp_path / "run"))
    if task == "charlm":
        text = tmp_path / "text.txt"
        text.write_text(TEXT, encoding="utf-8")
        values.update(text=str(text), seq_len=16)
    else:
        values.update(vocab=6, seq_len=5)
    values.update(changes)
    return TrainConfig(**values)


def parameters(trainer):
    return [p.data.copy() for p in trainer.model.parameters()]


def test_the_copy_task_is_learned(tmp_path):
    """The issue's copy task (10 symbols, length 10) with a small model:
    the loss falls by orders of magnitude and greedy decoding copies
    held-out sequences exactly."""
    config = TrainConfig(task="copy", layers=1, d_model=32, heads=4, ffn=64, batch_size=32, steps=400,
                         lr=5e-3, warmup=20, eval_every=100, eval_size=200, seed=0,
                         out=str(tmp_path / "copy"))
    trainer = quiet(config)
    trainer.fit()
    losses = [row[1] for row in trainer.history["train"]]
    assert np.mean(losses[:10]) > 2.0 and np.mean(losses[-20:]) < 0.02
    metrics = trainer.job.final_evaluate()
    assert metrics["exact_match"] >= 0.99
    # the periodic (teacher-forced) exact match agrees with greedy decoding
    assert abs(trainer.history["eval"][-1]["exact_match"] - metrics["exact_match"]) <= 0.01


@pytest.mark.parametrize("task, dropout", [("copy", 0.0), ("copy", 0.2), ("charlm", 0.2)])
def test_resume_continues_bit_for_bit(tmp_path, task, dropout):
    """N steps straight == k steps, checkpoint, a fresh Trainer from it, N - k steps."""
    config = tiny(tmp_path, task, dropout=dropout)
    straight = quiet(replace(config, out=str(tmp_path / "straight")))
    straight.fit()
    first = quiet(config)
    first.fit(until=5)
    at_5 = str(tmp_path / "step5.safetensors")
    shutil.copy(first.checkpoint_path, at_5)
    resumed = Trainer.from_checkpoint(at_5, progress=False, log=lambda line: None)
    assert resumed.step == 5
    resumed.fit()
    for a, b in zip(parameters(straight), parameters(resumed)):
        np.testing.assert_array_equal(a, b)
    assert straight.history["train"] == resumed.history["train"]
    assert straight.optimizer.state_dict()["param_groups"] == resumed.optimizer.state_dict()["param_groups"]

    # Negative control: without the saved random state the run differs
    # (other batches, other dropout masks), so the check above can fail.
    control = Trainer.from_checkpoint(at_5, progress=False, log=lambda line: None)
    tg.manual_seed(12345)
    control.fit()
    assert not all(np.array_equal(a, b) for a, b in zip(parameters(straight), parameters(control)))


def test_keyboard_interrupt_saves_the_last_completed_step(tmp_path):
    config = tiny(tmp_path)
    straight = quiet(replace(config, out=str(tmp_path / "straight")))
    straight.fit()

    def ctrl_c_at_step_4(trainer):
        if trainer.step == 4:
            raise KeyboardInterrupt

    lines = []
    trainer = Trainer(config, progress=False, log=lines.append)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(callbacks=[ctrl_c_at_step_4])
    _, metadata = read_checkpoint(trainer.checkpoint_path)
    assert metadata["step"] == "4"
    assert any("interrupted" in line and "resume" in line for line in lines)
    resumed = Trainer.from_checkpoint(tmp_path / "run", progress=False, log=lambda line: None)
    resumed.fit()
    for a, b in zip(parameters(straight), parameters(resumed)):
        np.testing.assert_array_equal(a, b)


def test_an_interrupt_during_the_update_waits_for_its_end():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the rest of the update ran")
    assert done == ["the rest of the update ran"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_just_after_a_metrics_line_does_not_write_it_twice(tmp_path, monkeypatch):
    """SIGINT or SIGTERM landing after a step's line reached metrics.jsonl but
    before the trainer counted it: the interrupt handler, which writes the
    steps not yet written, must not write that line again (seen in CI:
    train steps [1, 2, 3, 3] after a SIGTERM)."""
    from tinygrad_attn.train import trainer as trainer_module
    real_append = trainer_module.append_jsonl

    def append_then_signal(path, record):
        real_append(path, record)
        if record.get("type") == "train" and record["step"] == 3:
            signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt here
    monkeypatch.setattr(trainer_module, "append_jsonl", append_then_signal)
    trainer = quiet(tiny(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in records if r["type"] == "train"] == [1, 2, 3]
    assert records[-1] == {"type": "interrupted", "step": 3, "by": "interrupted"}


def test_weight_decay_only_on_weight_matrices():
    tg.manual_seed(0)
    for model in (Seq2SeqTransformer(Seq2SeqConfig(vocab_size=7, d_model=8, nhead=2, num_encoder_layers=1,
                                                   num_decoder_layers=1, dim_feedforward=16)),
                  GPT(GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=8))):
        decay, no_decay = weight_decay_groups(model, 0.1)
        assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
        names = {id(p): n for n, p in model.named_parameters()}
        decayed = sorted(names[id(p)] for p in decay["params"])
        kept = sorted(names[id(p)] for p in no_decay["params"])
        assert len(decayed) + len(kept) == len(names)
        for name in decayed:
            assert name.endswith(("linear1.weight", "linear2.weight", "out_proj.weight", "in_proj_weight",
                                  "generator.weight", "tok_emb.weight"))
        for name in kept:
            assert name.endswith(("bias", "norm1.weight", "norm2.weight", "norm3.weight", "norm.weight",
                                  "embed.weight", "pos_emb.weight"))
    # GPT's token embedding is tied to the output layer, a Linear: it decays (as in nanoGPT)
    assert "tok_emb.weight" in decayed and "pos_emb.weight" in kept


def test_schedules_peak_at_lr(tmp_path):
    def lrs(schedule, **changes):
        config = tiny(tmp_path, schedule=schedule, steps=100, warmup=10, lr=1e-3, **changes).resolved()
        w = tg.Tensor(np.zeros(2, np.float32), requires_grad=True)
        opt = optim.AdamW([w], lr=config.lr)
        sched = make_scheduler(opt, config, d_model=64)
        out = [opt.param_groups[0]["lr"]]
        for _ in range(100):
            sched.step()
            out.append(opt.param_groups[0]["lr"])
        return np.array(out)

    cosine = lrs("cosine")
    assert cosine[0] == 0 and math.isclose(cosine.max(), 1e-3) and cosine.argmax() == 10
    assert math.isclose(cosine[-1], 1e-4)  # min_lr defaults to lr / 10
    inverse = lrs("inverse-sqrt")
    assert math.isclose(inverse.max(), 1e-3) and inverse.argmax() == 10
    assert math.isclose(inverse[40], 1e-3 * math.sqrt(10 / 40))
    constant = lrs("constant")
    assert math.isclose(constant[5], 5e-4) and (constant[10:] == 1e-3).all()


def test_grad_norm_log(tmp_path):
    trainer = quiet(tiny(tmp_path, log_grad_norms=True))
    trainer.fit()
    path = os.path.join(trainer.config.out, "grad_norms.jsonl")
    records = [json.loads(line) for line in open(path)]
    assert [r["step"] for r in records] == [1, 3, 6]
    names = [n for n, _ in trainer.model.named_parameters()]
    for r in records:
        assert list(r["norms"]) == names
        assert math.isclose(r["total"], math.sqrt(sum(v * v for v in r["norms"].values())))
        assert all(v >= 0 for v in r["norms"].values())


def test_charlm_report_and_outputs(tmp_path):
    lines = []
    trainer = Trainer(tiny(tmp_path, "charlm", steps=4, eval_every=2), progress=False, log=lines.append)
    trainer.fit()
    metrics = trainer.report()
    assert set(metrics) == {"val_loss"} and np.isfinite(metrics["val_loss"])
    assert len(trainer.history["eval"]) == 2
    out = tmp_path / "run"
    assert (out / "loss.png").stat().st_size > 0 and (out / "metrics.json").exists()
    assert sorted(os.listdir(out / "attention")) == ["layer.0.self_attn.png"]
    assert any(line.startswith("sample") for line in lines)


def test_report_prints_the_results_before_it_draws_the_plots(tmp_path, monkeypatch):
    """Drawing the heatmaps takes seconds (6 s for the default copy run): the
    results are printed first, then a line saying that it draws, and the
    checkpoint's path once everything is written."""
    from tinygrad_attn.train import plots
    lines, seen_while_drawing = [], []
    draw = plots.attention_heatmaps
    monkeypatch.setattr(plots, "attention_heatmaps",
                        lambda *args: seen_while_drawing.extend(lines) or draw(*args))
    trainer = Trainer(tiny(tmp_path, steps=4, eval_every=2), progress=False, log=lines.append)
    trainer.fit()
    del lines[:]
    trainer.report()
    assert seen_while_drawing, "the heatmaps were not drawn"
    assert seen_while_drawing[0].startswith("done: 4 steps")
    assert any(line.startswith("final val_loss") for line in seen_while_drawing)
    assert seen_while_drawing[-1] == "drawing the loss curve and the attention heatmaps ..."
    assert lines[len(seen_while_drawing)].startswith("loss curve: ")
    assert lines[-1] == f"checkpoint: {trainer.checkpoint_path}"


def test_resume_can_train_longer_and_refuses_to_do_nothing(tmp_path):
    trainer = quiet(tiny(tmp_path, steps=6, warmup=1))
    trainer.fit()
    with pytest.raises(ConfigError, match="nothing to do"):
        Trainer.from_checkpoint(trainer.checkpoint_path)
    longer = Trainer.from_checkpoint(trainer.checkpoint_path, steps=9, progress=False, log=lambda line: None)
    assert longer.scheduler.total_steps == 9 and longer.config.steps == 9
    longer.fit()
    assert longer.step == 9 and len(longer.history["train"]) == 9


def test_resume_checks_the_text_and_the_checkpoint(tmp_path):
    trainer = quiet(tiny(tmp_path, "charlm", steps=4, eval_every=4))
    trainer.fit(until=2)
    (tmp_path / "text.txt").write_text(TEXT.upper(), encoding="utf-8")
    with pytest.raises(ValueError, match="not the text this checkpoint was trained on"):
        Trainer.from_checkpoint(trainer.checkpoint_path)
    foreign = tmp_path / "weights.safetensors"
    tg.save({"w": np.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="not a tinygrad_attn training checkpoint"):
        read_checkpoint(foreign)
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "missing.safetensors")


def test_config_defaults_per_task_and_validation():
    copy = TrainConfig().resolved()
    assert (copy.vocab, copy.seq_len, copy.layers, copy.out) == (10, 10, 2, "runs/copy")
    assert math.isclose(copy.min_lr, copy.lr / 10)
    sort = TrainConfig(task="sort").resolved()
    assert (sort.vocab, sort.seq_len) == (3, 6)  # minGPT's sort task
    lm = TrainConfig(task="charlm", text="x.txt").resolved()
    assert (lm.layers, lm.heads, lm.d_model, lm.seq_len, lm.batch_size, lm.steps, lm.lr) == \
        (4, 4, 128, 64, 12, 2000, 1e-3)  # nanoGPT's CPU configuration
    assert TrainConfig.from_json(lm.to_json()) == lm
    for bad, message in [(dict(task="translate"), "unknown task"),
                         (dict(d_model=30, heads=4), "divisible"),
                         (dict(task="charlm"), "needs --text"),
                         (dict(text="a.txt"), "--text is for --task charlm"),
                         (dict(steps=10, warmup=10), "smaller than --steps"),
                         (dict(dropout=1.0), "dropout"),
                         (dict(lr=1e-3, min_lr=1e-2), "min-lr"),
                         (dict(min_seq_len=11), "longer than"),
                         (dict(task="charlm", text="a.txt", vocab=5), "seq2seq")]:
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**bad).resolved()


def test_training_does_not_touch_the_evaluation_sets(tmp_path):
    """Evaluating draws nothing from the framework's generator."""
    trainer = quiet(tiny(tmp_path))
    state = tg.get_generator().bit_generator.state
    trainer.evaluate()
    trainer.job.final_evaluate()
    assert tg.get_generator().bit_generator.state == state


def test_modules_are_in_train_mode_while_training_and_restored_after_evaluation(tmp_path):
    trainer = quiet(tiny(tmp_path, dropout=0.1))
    modes = []
    trainer.fit(until=3, callbacks=[lambda t: modes.append(t.model.training)])
    assert modes == [True, True, True]
    assert all(m.training for m in trainer.model.modules())
    assert isinstance(trainer.model, nn.Module)


@pytest.mark.parametrize("progress", [True, False])
def test_evaluation_lines_go_to_the_log(tmp_path, progress):
    lines = []
    Trainer(tiny(tmp_path, steps=4, eval_every=2), progress=progress, log=lines.append).fit()
    assert [line.split(" |")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert all("tok/s" in line and "exact_match" in line for line in lines)


def test_progress_bar_shows_step_loss_lr_and_throughput(tmp_path, monkeypatch):
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):  # tqdm draws its bar only on a terminal
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bars, lines = [], []
    trainer = Trainer(tiny(tmp_path, steps=4, eval_every=2), progress=True, log=lines.append)
    trainer.fit(callbacks=[lambda t: bars.append(str(t._bar))])
    assert len(bars) == 4
    for step, bar in enumerate(bars, 1):
        assert re.search(rf" {step}/4 .*loss \d+\.\d{{4}} \| lr \d\.\d\de-\d\d \| [\d,]+ tok/s", bar), bar
    assert [line.split(" |")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert "tok/s" in sys.stderr.getvalue()


# --------------------------------------------------------------------------- run directories
def test_a_fresh_run_refuses_a_directory_holding_a_run(tmp_path):
    from tinygrad_attn.train import RunExistsError
    quiet(tiny(tmp_path, steps=3)).fit()
    again = quiet(tiny(tmp_path, steps=4))
    with pytest.raises(RunExistsError, match="already holds a run .*--overwrite"):
        again.fit()
    assert read_checkpoint(tmp_path / "run")[1]["step"] == "3"
    replaced = quiet(tiny(tmp_path, steps=4), overwrite=True)
    replaced.fit()
    assert read_checkpoint(tmp_path / "run")[1]["step"] == "4"


def test_metrics_jsonl_is_written_as_the_run_goes(tmp_path):
    seen = []

    def last_record(trainer):
        with open(os.path.join(trainer.config.out, "metrics.jsonl")) as f:
            seen.append(json.loads(f.readlines()[-1]))

    trainer = quiet(tiny(tmp_path, steps=4, eval_every=2))
    trainer.fit(callbacks=[last_record])
    assert [(r["type"], r["step"]) for r in seen] == [("train", s) for s in (1, 2, 3, 4)]  # each at once
    trainer.report(plots=False)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [(r["type"], r["step"]) for r in records] == [
        ("train", 1), ("train", 2), ("eval", 2), ("train", 3), ("train", 4), ("eval", 4), ("final", 4)]
    for r, row in zip([r for r in records if r["type"] == "train"], trainer.history["train"]):
        assert [r["step"], r["loss"], r["lr"], r["grad_norm"]] == row
        assert r["grad_norm"] > 0
    assert set(records[2]) == {"type", "step", "val_loss", "exact_match"}
    summary = json.load(open(tmp_path / "run" / "metrics.json"))
    assert summary["status"] == "done" and summary["final"] == {k: v for k, v in records[-1].items()
                                                                 if k not in ("type", "step")}


def test_a_diverging_step_is_not_applied_and_non_finite_weights_are_never_saved(tmp_path):
    from tinygrad_attn.train import TrainingDiverged
    trainer = quiet(tiny(tmp_path, steps=6, eval_every=2))
    original = trainer.job.loss

    def nan_at_step_4(batch):
        loss = original(batch)
        return loss * float("nan") if trainer.step == 3 else loss

    trainer.job.loss = nan_at_step_4
    weights = []
    with pytest.raises(TrainingDiverged, match="diverged at step 4.*checkpoint of step 2"):
        trainer.fit(callbacks=[lambda t: weights.append(parameters(t))])
    assert trainer.step == 3
    for a, b in zip(weights[-1], parameters(trainer)):  # step 4 changed nothing
        np.testing.assert_array_equal(a, b)
    assert read_checkpoint(trainer.checkpoint_path)[1]["step"] == "2"
    next(iter(trainer.model.parameters())).data[0] = np.inf
    with pytest.raises(TrainingDiverged, match="not finite"):
        trainer.save_checkpoint()
    assert read_checkpoint(trainer.checkpoint_path)[1]["step"] == "2"


def test_sigterm_during_fit_saves_like_ctrl_c(tmp_path):
    from tinygrad_attn.train import Terminated

    def kill_at_step_3(trainer):
        if trainer.step == 3:
            signal.raise_signal(signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    trainer = quiet(tiny(tmp_path))
    with pytest.raises(Terminated):
        trainer.fit(callbacks=[kill_at_step_3])
    assert read_checkpoint(trainer.checkpoint_path)[1]["step"] == "3"
    assert signal.getsignal(signal.SIGTERM) == previous  # restored after fit
    assert json.load(open(tmp_path / "run" / "metrics.json"))["status"] == "interrupted"


def test_a_sigterm_during_the_update_waits_for_its_end(tmp_path):
    from tinygrad_attn.train.signals import Terminated, sigterm_as_interrupt
    done = []
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            with interrupts_deferred():
                signal.raise_signal(signal.SIGTERM)
                done.append("the rest of the update ran")
    assert done == ["the rest of the update ran"]


def test_sequences_longer_than_the_default_positional_table(tmp_path):
    """--seq-len 255 used to fail at the final (greedy) evaluation, 256 at
    step 1: the model's table is now sized for the task."""
    from tinygrad_attn.train.jobs import make_job
    for seq_len in (255, 256, 300):
        job = make_job(tiny(tmp_path, seq_len=seq_len, vocab=3, eval_size=1).resolved())
        # greedy decoding produces up to seq_len + 1 tokens and needs max_len beyond that
        assert job.model.config.max_len > job.held_out.tgt_out.shape[1]
    assert np.isfinite(job.loss(job.train_batch(1)).item())


# --------------------------------------------------------------------------- nanoGPT's options
def test_charlm_decays_the_position_table_as_nanogpt():
    tg.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=8))
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = weight_decay_groups(model, 0.1, decay_embeddings=True)
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed == {n for n, p in model.named_parameters() if p.ndim >= 2}  # nanoGPT: every 2-D param
    assert "pos_emb.weight" in decayed
    assert all(names[id(p)].endswith(("bias", "weight")) and p.ndim == 1 for p in no_decay["params"])
    assert TrainConfig(task="charlm", text="x.txt").resolved().decay_embeddings
    assert not TrainConfig().resolved().decay_embeddings


def test_beta2_bias_and_gelu_reach_the_optimizer_and_model(tmp_path):
    trainer = quiet(tiny(tmp_path, "charlm", beta2=0.95, bias=False, gelu="tanh"))
    assert all(g["betas"] == (0.9, 0.95) for g in trainer.optimizer.param_groups)
    assert (trainer.model.config.bias, trainer.model.config.gelu) == (False, "tanh")
    assert not any(name.endswith("bias") for name, _ in trainer.model.named_parameters())
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    assert "pos_emb.weight" in {names[id(p)] for p in trainer.optimizer.param_groups[0]["params"]}
    for bad, message in [(dict(gelu="fast"), "--gelu"), (dict(beta2=1.0), "--beta2")]:
        with pytest.raises(ConfigError, match=message):
            tiny(tmp_path, "charlm", **bad).resolved()


def _as_old_checkpoint(path):
    """Rewrite a checkpoint as the first format wrote it: no bias / gelu /
    beta2 / decay_embeddings settings, no gelu in the model config, a
    history without gradient norms."""
    arrays, metadata = tg.load(path, with_metadata=True)
    config = json.loads(metadata["config"])
    for name in ("bias", "gelu", "beta2", "decay_embeddings"):
        del config[name]
    model = json.loads(metadata["model"])
    model.pop("gelu", None)
    metadata.update(config=json.dumps(config), model=json.dumps(model))
    arrays["history.train"] = arrays["history.train"][:, :3]
    tg.save(arrays, path, metadata=metadata)


@pytest.mark.parametrize("task", ["copy", "charlm"])
def test_checkpoints_of_the_first_format_still_load_and_resume(tmp_path, task):
    from tinygrad_attn.train import load_run
    trainer = quiet(tiny(tmp_path, task, steps=4, eval_every=2, weight_decay=0.1, decay_embeddings=False))
    trainer.fit(until=2)
    _as_old_checkpoint(trainer.checkpoint_path)
    resumed = Trainer.from_checkpoint(tmp_path / "run", progress=False, log=lambda line: None)
    assert not resumed.config.decay_embeddings  # as those runs were trained (minGPT's rule)
    assert resumed.config.beta2 == 0.99 and resumed.history["train"][0][3] is None
    resumed.fit()
    assert resumed.step == 4
    model, meta = load_run(tmp_path / "run")
    assert meta.step == 4 and not model.training


# --------------------------------------------------------------------------- plots
def test_the_loss_figure_shows_the_learning_rate_and_gradient_norm(tmp_path):
    pytest.importorskip("matplotlib")
    from tinygrad_attn.train.plots import loss_figure
    trainer = quiet(tiny(tmp_path, steps=4, eval_every=2))
    trainer.fit()
    fig = loss_figure(trainer.history)
    by_label = {ax.get_ylabel(): ax for ax in fig.axes}
    lr_line = by_label["learning rate"].get_lines()[0]
    np.testing.assert_allclose(lr_line.get_ydata(), [row[2] for row in trainer.history["train"]])
    norm_line = by_label["grad norm"].get_lines()[0]
    np.testing.assert_allclose(norm_line.get_ydata(), [row[3] for row in trainer.history["train"]])


def test_charlm_heatmaps_have_few_upright_single_glyph_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from tinygrad_attn.train.plots import heatmap_figure
    trainer = quiet(tiny(tmp_path, "charlm"))
    name, weights, keys, queries, title = trainer.job.attention_example()[0]
    assert len(keys) <= 16 and all(len(k) == 1 for k in keys)  # "\n" and " " drawn as one glyph
    fig = heatmap_figure(weights, keys, queries, title)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) >= 2
    for ax in panels:
        labels = ax.get_xticklabels()
        assert [t.get_text() for t in labels] == keys
        assert all(t.get_rotation() == 0 and t.get_fontsize() >= 10 for t in labels)


def test_docs_describe_every_field_of_the_metrics_files(tmp_path):
    from pathlib import Path
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    trainer = quiet(tiny(tmp_path, steps=3, eval_every=1))
    trainer.fit()
    trainer.report(plots=False)
    names = set()
    for line in open(tmp_path / "run" / "metrics.jsonl"):
        record = json.loads(line)
        names |= set(record) | {record["type"]}
    summary = json.load(open(tmp_path / "run" / "metrics.json"))
    names |= set(summary) | set(summary["history"]) | {summary["status"]}
    names |= {"interrupted", "diverged", "by"}  # the records of a stopped run
    missing = sorted(n for n in names if f"`{n}`" not in docs and f'"{n}"' not in docs)
    assert missing == []

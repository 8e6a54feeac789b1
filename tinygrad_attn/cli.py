"""The command line: train, resume, sample, decode, export, warmup.

    python -m tinygrad_attn train                      # the copy task, ~30 s
    python -m tinygrad_attn train --task charlm --text input.txt
    python -m tinygrad_attn resume runs/copy --steps 600
    python -m tinygrad_attn sample runs/charlm --prompt "ROMEO:" --length 300
    python -m tinygrad_attn decode runs/reverse --input "3 1 4 1 5"
    python -m tinygrad_attn export runs/charlm --to torch charlm.safetensors
    python -m tinygrad_attn warmup                     # compile the kernels now (first run only)

(also installed as the `tinygrad-attn` command). Exit status: 0 done; 1 the
training diverged (the last finite checkpoint is kept); 2 a user error: a
bad option or setting, a missing or unreadable file, a checkpoint that is
not ours, an output that already exists (one line on stderr, before any
training starts); 130 Ctrl-C and 143 SIGTERM during training (a checkpoint,
metrics and plots are saved first); 141 the output was closed (e.g. piped
into `head`; a training run saves first).
"""
import argparse
import os
import re
import sys

import numpy as np

from .checkpoint import CheckpointError
from .nn import StateDictError
from .train.config import ARCHS, GELUS, SCHEDULES, TASK_DEFAULTS, TASKS, ConfigError, TrainConfig

# Errors that mean "the user asked for something that cannot be done": reported in one line.
# (OSError: a missing file, a directory where a file should be, no permission to write --out...)
USER_ERRORS = (ConfigError, CheckpointError, StateDictError, OSError, ValueError)
EXIT_DIVERGED, EXIT_USER_ERROR, EXIT_SIGINT, EXIT_BROKEN_PIPE, EXIT_SIGTERM = 1, 2, 130, 141, 143


class _Parser(argparse.ArgumentParser):
    """argparse, with errors on one line (plus a hint) instead of the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Fail(Exception):
    """A user error found while running a command (exit status 2)."""


def _number_type(convert, accept, expected, unparsable=None):
    """An argparse type: convert(text), with a one-line error unless it parses and accept(value)."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {unparsable or expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_positive_int = _number_type(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _number_type(int, lambda v: v >= 0, "an integer >= 0")
_non_negative_float = _number_type(float, lambda v: v >= 0 and v != float("inf"), "a finite number >= 0",
                                   unparsable="a number")


def _task_default(name):
    """'2; charlm: 4': the default of a setting, and the tasks where it differs."""
    main = TASK_DEFAULTS["copy"][name]
    others = [f"{task}: {TASK_DEFAULTS[task][name]}" for task in TASKS
              if TASK_DEFAULTS[task][name] != main and TASK_DEFAULTS[task][name] is not None]
    return "; ".join([f"{main}"] + others)


def _add_train_options(p):
    d = _task_default
    task = p.add_argument_group("task")
    task.add_argument("--task", choices=TASKS, default="copy",
                      help="copy, reverse or sort a sequence of symbols (encoder-decoder Transformer), "
                           "or charlm: character-level language model of --text (GPT-style decoder) "
                           "(default: copy)")
    task.add_argument("--text", metavar="FILE",
                      help="UTF-8 text file for --task charlm, the last 10%% being the validation "
                           "split (default: none; charlm needs one)")
    task.add_argument("--seq-len", type=_positive_int, metavar="N",
                      help=f"sequence length; for charlm the context (block) size (default: {d('seq_len')})")
    task.add_argument("--min-seq-len", type=_positive_int, metavar="N",
                      help="seq2seq tasks: shortest sequence, lengths drawn in [N, seq-len] and padded "
                           "(default: all sequences have seq-len symbols)")
    task.add_argument("--vocab", type=_positive_int, metavar="N",
                      help=f"seq2seq tasks: number of distinct symbols (default: {d('vocab')})")

    model = p.add_argument_group("model")
    model.add_argument("--layers", type=_positive_int, metavar="N",
                       help=f"encoder and decoder layers (each), or charlm blocks (default: {d('layers')})")
    model.add_argument("--d-model", type=_positive_int, metavar="N",
                       help=f"width of the model (default: {d('d_model')})")
    model.add_argument("--heads", type=_positive_int, metavar="N",
                       help=f"attention heads; must divide --d-model (default: {d('heads')})")
    model.add_argument("--ffn", type=_positive_int, metavar="N",
                       help=f"hidden width of the feed-forward layers (default: {d('ffn')}; --arch llama: "
                            "llama2.c's SwiGLU rule, 2/3 of 4 d_model rounded up to a multiple of 32)")
    model.add_argument("--dropout", type=_non_negative_float, default=0.0, metavar="P",
                       help="dropout probability (default: 0)")
    model.add_argument("--arch", choices=ARCHS, default=None,
                       help="charlm: the model, gpt (nanoGPT's GPT-2: LayerNorm, learned positions, GELU) "
                            "or llama (llama2.c's Llama 2: RMSNorm, rotary positions, SwiGLU, "
                            "grouped-query attention, no biases) (default: gpt)")
    model.add_argument("--kv-heads", type=_positive_int, metavar="N",
                       help="--arch llama: key/value heads, each shared by heads / N query heads; must "
                            "divide --heads (default: heads // 2, or heads if odd)")
    model.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                       help="charlm: biases in the GPT's Linear and LayerNorm layers; nanoGPT trains "
                            "with --no-bias (default: --bias)")
    model.add_argument("--gelu", choices=GELUS, default=None,
                       help="charlm: the feed-forward GELU, exact (nanoGPT's nn.GELU()) or its tanh "
                            "approximation (GPT-2's) (default: exact)")

    opt = p.add_argument_group("optimisation (AdamW, beta1 0.9)")
    opt.add_argument("--steps", type=_positive_int, metavar="N",
                     help=f"training steps (default: {d('steps')})")
    opt.add_argument("--batch-size", type=_positive_int, metavar="N",
                     help=f"sequences per step (default: {d('batch_size')})")
    opt.add_argument("--lr", type=_non_negative_float, metavar="LR",
                     help=f"peak learning rate (default: {d('lr')})")
    opt.add_argument("--warmup", type=_non_negative_int, metavar="N",
                     help=f"steps of linear warmup (default: {d('warmup')})")
    opt.add_argument("--schedule", choices=SCHEDULES, default="cosine",
                     help="learning-rate schedule after warmup: cosine decay to --min-lr at the last "
                          "step, the paper's inverse square root, or constant (default: cosine)")
    opt.add_argument("--min-lr", type=_non_negative_float, metavar="LR",
                     help="final learning rate of the cosine schedule (default: lr / 10)")
    opt.add_argument("--weight-decay", type=_non_negative_float, metavar="WD",
                     help="AdamW weight decay of weight matrices; biases and norms are never "
                          f"decayed (default: {d('weight_decay')})")
    opt.add_argument("--decay-embeddings", action=argparse.BooleanOptionalAction, default=None,
                     help="decay the embedding and position tables too, i.e. every 2-D parameter "
                          "(nanoGPT's rule) (default: off; charlm: on)")
    opt.add_argument("--beta2", type=_number_type(float, lambda v: 0 <= v < 1, "a number in [0, 1)"),
                     default=0.99, metavar="B2",
                     help="AdamW's second-moment decay; nanoGPT's choice for small models, faster "
                          "than 0.999 (default: 0.99)")
    opt.add_argument("--grad-clip", type=_non_negative_float, default=1.0, metavar="NORM",
                     help="clip the global gradient norm to NORM, 0 to disable (default: 1.0)")
    opt.add_argument("--seed", type=_non_negative_int, default=0, metavar="N",
                     help="random seed of the run (default: 0)")

    run = p.add_argument_group("evaluation and output")
    run.add_argument("--eval-every", type=_positive_int, metavar="N",
                     help=f"evaluate and save a checkpoint every N steps (default: {d('eval_every')})")
    run.add_argument("--eval-size", type=_positive_int, metavar="N",
                     help="held-out sequences (seq2seq) or validation windows (charlm) per evaluation "
                          f"(default: {d('eval_size')})")
    run.add_argument("--out", metavar="DIR",
                     help="output directory: checkpoint, metrics, loss curve, attention heatmaps "
                          "(default: runs/TASK)")
    run.add_argument("--overwrite", action="store_true",
                     help="if --out holds a run, delete that run's files (checkpoint, metrics, "
                          "plots; nothing else) and start afresh; without it such a directory is refused")
    run.add_argument("--log-grad-norms", action="store_true",
                     help="write each parameter's gradient norm (before clipping) at step 1 and every "
                          "--eval-every steps to DIR/grad_norms.jsonl")
    _add_display_options(run)


def _add_display_options(group):
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    group.add_argument("--no-plots", action="store_true",
                       help="do not write the loss curve and attention heatmaps")
    _add_threads_option(group)


def _add_threads_option(group):
    group.add_argument("--threads", type=_positive_int, metavar="N",
                       help="compute with N threads, kernels and BLAS (default: every core this "
                            "process may use)")


def build_parser(prog="tinygrad-attn"):
    """The argument parser; `parser.commands` maps each command to its sub-parser."""
    parser = _Parser(prog=prog, description="Train and run small Transformers with tinygrad_attn.",
                     epilog=f"Run `{prog} COMMAND --help` for the options of a command.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)

    train = commands.add_parser(
        "train", help="train a model on a built-in task (default: the copy task, ~30 s on 2 cores)",
        description="Train a Transformer on a built-in task and write a checkpoint, metrics, a loss curve "
                    "and attention heatmaps to --out. Some defaults depend on the task: "
                    "'default: 2; charlm: 4' means 2 for copy, reverse and sort, and 4 for "
                    "charlm. An --out that already holds a run is refused unless --overwrite. "
                    "Ctrl-C or SIGTERM saves a checkpoint; a diverging run stops at the first "
                    "non-finite loss and keeps its last checkpoint.")
    _add_train_options(train)

    resume = commands.add_parser(
        "resume", help="continue training from a checkpoint",
        description="Continue a run from its checkpoint, with the same optimizer state, schedule "
                    "and random state: the result equals an uninterrupted run. The run goes on "
                    "in the checkpoint's directory unless --out says otherwise.")
    resume.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="the run's directory, or a checkpoint file")
    cont = resume.add_argument_group("run")
    cont.add_argument("--steps", type=_positive_int, metavar="N",
                      help="train until step N in total (default: the run's --steps); a longer "
                           "run stretches the cosine schedule to N")
    cont.add_argument("--text", metavar="FILE",
                      help="charlm: the run's text at a new place; its contents must be the same "
                           "(default: the path stored in the checkpoint)")
    out = resume.add_argument_group("output")
    out.add_argument("--out", metavar="DIR",
                     help="output directory (default: the directory of CHECKPOINT)")
    out.add_argument("--overwrite", action="store_true",
                     help="let --out replace another run's files there")
    _add_display_options(out)

    sample = commands.add_parser("sample", help="generate text from a charlm checkpoint",
                                 description="Continue a prompt with a character-level model.")
    sample.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="checkpoint file, or the run's output directory")
    sample.add_argument("--prompt", default="\n",
                        help="text to continue; its characters must occur in the training text "
                             "(default: a newline)")
    sample.add_argument("--length", type=_positive_int, default=500, metavar="N",
                        help="characters to generate (default: 500)")
    sample.add_argument("--temperature", type=_non_negative_float, default=0.8, metavar="T",
                        help="divide the logits by T; lower is more conservative, 0 is greedy "
                             "(default: 0.8)")
    sample.add_argument("--top-k", type=_positive_int, metavar="K",
                        help="sample only among the K most likely characters (default: all)")
    sample.add_argument("--num-samples", type=_positive_int, default=1, metavar="N",
                        help="independent samples (default: 1)")
    sample.add_argument("--seed", type=_non_negative_int, metavar="N",
                        help="random seed, for repeatable samples (default: a fresh one)")

    decode = commands.add_parser("decode", help="run a seq2seq checkpoint on input sequences",
                                 description="Decode sequences greedily with a copy/reverse/sort model.")
    parser.commands = {"train": train, "resume": resume, "sample": sample, "decode": decode}
    decode.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="checkpoint file, or the run's output directory")
    decode.add_argument("--input", action="append", metavar="SYMBOLS",
                        help='a source sequence of symbols, e.g. "3 1 4 1 5" (repeat for more; '
                             "default: held-out sequences of the task)")
    decode.add_argument("--num-examples", type=_positive_int, default=5, metavar="N",
                        help="without --input: how many held-out sequences to decode (default: 5)")

    export = commands.add_parser(
        "export", help="write a run's model for another framework (PyTorch, llama2.c)",
        description="Write the trained model as a safetensors state dict with PyTorch's "
                    "parameter names, loadable with strict=True into the modules of "
                    "examples/torch_models.py (GPT: nanoGPT's layout; Llama: llama2.c's; seq2seq: "
                    "around torch.nn.Transformer); the file's metadata holds the module and its config. "
                    "--to llama2c writes a Llama run as the model and tokenizer files of llama2.c's run.c.")
    export.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="checkpoint file, or the run's output directory")
    export.add_argument("--to", choices=("torch", "llama2c"), default="torch",
                        help="the target: torch (a safetensors state dict) or llama2c (an --arch llama "
                             "charlm run as llama2.c's run.c reads it: OUTPUT and, beside it, "
                             "OUTPUT's name + .tokenizer.bin) (default: torch)")
    export.add_argument("output", metavar="OUTPUT", help="the file to write (.safetensors; llama2c: .bin)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace OUTPUT if it exists (never a file of the run itself)")
    parser.commands["export"] = export

    warm = commands.add_parser(
        "warmup", help="compile the kernels of a training step now (first run after installing)",
        description="Compile, in this process, the float32 and float64 Numba kernels that a "
                    "Transformer training step uses, into Numba's on-disk cache, so that the next "
                    "runs start at once. `train` does this by itself when it needs to.")
    warm.add_argument("--dtype", choices=("float32", "float64", "both"), default="both",
                      help="which kernels (default: both)")
    parser.commands["warmup"] = warm
    for name in ("sample", "decode"):
        _add_threads_option(parser.commands[name])
    return parser


# --------------------------------------------------------------------------- commands
def _say(line=""):
    """Print a line of output at once (watchable through a pipe or `tee`)."""
    print(line, flush=True)


def _describe(trainer):
    c, model = trainer.config, trainer.model
    if c.is_seq2seq:
        task = f"task {c.task}: {c.vocab} symbols, length {c.seq_len}"
        if c.min_seq_len:
            task = f"task {c.task}: {c.vocab} symbols, lengths {c.min_seq_len}-{c.seq_len}"
        shape = f"Seq2SeqTransformer {c.layers}+{c.layers} layers"
        options = ""
    else:
        task = f"task charlm: {c.text} ({trainer.job.data.vocab_size} characters), context {c.seq_len}"
        if c.arch == "llama":
            shape = f"Llama {c.layers} blocks"
            options = f", {c.kv_heads} key/value heads, RMSNorm, rotary, SwiGLU"
        else:
            shape = f"GPT {c.layers} blocks"
            options = f", {'bias' if c.bias else 'no bias'}, {c.gelu} GELU"
    decay = f"weight decay {c.weight_decay:g}{' (embeddings too)' if c.decay_embeddings else ''}"
    return [task,
            f"model: {shape}, d_model {c.d_model}, {c.heads} heads, ffn {c.ffn}, dropout {c.dropout}"
            f"{options}, {model.num_parameters():,} parameters",
            f"training: {c.steps} steps, batch {c.batch_size}, AdamW lr {c.lr:g} ({c.schedule}, warmup "
            f"{c.warmup}), beta2 {c.beta2:g}, {decay}, clip {c.grad_clip:g}, seed {c.seed}",
            f"output: {c.out}"]


def _setup(make_trainer):
    """Build the trainer and prepare its output directory, so that every
    user error (settings, files, an existing run) is reported before training."""
    try:
        trainer = make_trainer()
        trainer.prepare_output()
    except USER_ERRORS as e:
        raise _Fail(e) from None
    return trainer


def _compile_kernels(trainer):
    """On the first run after installing, compile the kernels of this run's
    step before training, with a second process sharing the work (warmup.py)."""
    import json

    from . import warmup
    settings = {k: v for k, v in json.loads(trainer.config.to_json()).items() if k not in ("out", "steps")}
    key = "train " + json.dumps(settings, sort_keys=True)  # the same settings: the same kernels
    if warmup.is_warm(key):
        return
    calls = trainer.kernel_calls()
    _say("compiling kernels (first run of these settings; cached for the next) ...")
    _say(f"compiled {len({kernel for kernel, _ in calls})} kernels in "
         f"{warmup.compile_kernels(calls, helper=True, key=key):.1f} s")


def _run(trainer, args):
    from .train.trainer import TrainingDiverged
    args.trainer = trainer  # for main's message if the output closes
    for line in _describe(trainer):
        _say(line)
    if trainer.step:
        _say(f"resuming at step {trainer.step}")
    _compile_kernels(trainer)
    try:
        trainer.fit()  # Ctrl-C / SIGTERM / a closed output: the trainer saves a checkpoint first
    except (KeyboardInterrupt, BrokenPipeError, TrainingDiverged):
        if not args.no_plots and trainer.history["train"]:
            try:
                trainer.write_plots()
            except (KeyboardInterrupt, BrokenPipeError):
                pass  # the checkpoint and metrics are written; a second Ctrl-C skips the plots
            except Exception as e:  # noqa: BLE001 -- the run's own ending matters more than its plots
                print(f"plots not written: {e}", flush=True)
        raise
    trainer.report(plots=not args.no_plots)
    return 0


def _train_config(args):
    from dataclasses import fields
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def _cmd_train(args):
    from .train.trainer import Trainer
    config = _train_config(args)
    return _run(_setup(lambda: Trainer(config, progress=not args.no_progress, log=_say,
                                       overwrite=args.overwrite)), args)


def _cmd_resume(args):
    from .train.trainer import Trainer
    return _run(_setup(lambda: Trainer.from_checkpoint(
        args.checkpoint, steps=args.steps, out=args.out, text=args.text, progress=not args.no_progress,
        log=_say, overwrite=args.overwrite)), args)


def _load_run(path, kind, command):
    """The model and RunInfo of a run, which must hold a `kind` model."""
    from .train.run import load_run
    try:
        model, meta = load_run(path)
    except USER_ERRORS as e:
        raise _Fail(e) from None
    kinds = ("GPT", "Llama") if kind == "GPT" else (kind,)  # GPT: a charlm model, either architecture
    if type(model).__name__ not in kinds:
        other = "decode" if kind == "GPT" else "sample"
        raise _Fail(f"{command} needs a {'charlm' if kind == 'GPT' else 'copy/reverse/sort'} "
                    f"checkpoint; {path} holds a {type(model).__name__} (use `{other}`)")
    return model, meta


def _cmd_sample(args):
    model, meta = _load_run(args.checkpoint, "GPT", "sample")
    try:
        prompt = meta.encode(args.prompt) if args.prompt else None
    except ValueError as e:
        raise _Fail(f"--prompt: {e}") from None
    if prompt is None or prompt.size == 0:
        raise _Fail("--prompt must not be empty")
    rng = np.random.default_rng(args.seed)
    for i in range(args.num_samples):
        ids = model.generate(prompt, args.length, temperature=args.temperature, top_k=args.top_k,
                             generator=rng)
        if args.num_samples > 1:
            _say(f"--- sample {i + 1}")
        _say(meta.decode(ids))
    return 0


def _parse_symbols(text, num_symbols):
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts or not all(re.fullmatch(r"[+-]?\d+", p) for p in parts):
        raise _Fail(f"--input {text!r}: expected symbols as integers separated by spaces, e.g. \"3 1 4\"")
    symbols = [int(p) for p in parts]
    bad = [s for s in symbols if not 0 <= s < num_symbols]
    if bad:
        raise _Fail(f"--input {text!r}: symbols must be in 0..{num_symbols - 1} (the model was trained "
                    f"on {num_symbols} symbols), got {bad[0]}")
    return symbols


def _cmd_decode(args):
    from .data import get_task, sequence_matches
    model, meta = _load_run(args.checkpoint, "Seq2SeqTransformer", "decode")
    config = meta.config
    if args.input:
        rows = [_parse_symbols(text, config.vocab) for text in args.input]
        longest, limit = max(len(r) for r in rows), model.config.max_len - 2
        if longest > limit:
            raise _Fail(f"--input: at most {limit} symbols, got {longest}")
        shortest = min(len(r) for r in rows)
        if config.min_seq_len is None and (shortest < config.seq_len or longest > config.seq_len):
            _say(f"note: the model was trained on sequences of exactly {config.seq_len} symbols; "
                 "other lengths test how it generalises")
        elif longest > config.seq_len:
            _say(f"note: the model was trained on sequences of at most {config.seq_len} symbols; "
                 "longer ones test how it generalises")
        batch = get_task(config.task, num_symbols=config.vocab, length=longest).make_batch(rows)
    else:
        batch = meta.tokenizer.held_out_batch(args.num_examples)
    predictions = model.greedy_decode(batch.src)
    right = sequence_matches(predictions, batch.tgt_out)

    def show(ids):
        return " ".join(str(s) for s in meta.decode(ids)) or "(empty)"

    for i in range(len(batch)):
        _say(f"input      {show(batch.src[i])}")
        _say(f"expected   {show(batch.tgt_out[i])}")
        _say(f"prediction {show(predictions[i])}  {'(right)' if right[i] else '(WRONG)'}")
    _say(f"{int(right.sum())}/{len(right)} right")
    return 0


def _cmd_export(args):
    from .train.run import export_torch
    if args.to == "llama2c":
        from .llama2c import export_run
        try:
            model, tokenizer = export_run(args.checkpoint, args.output, overwrite=args.overwrite)
        except (*USER_ERRORS, TypeError) as e:
            raise _Fail(e) from None
        _say(f"wrote {model} and {tokenizer}: in llama2.c, ./run {model} -z {tokenizer} -t 0 "
             "(generation starts at a newline, llama2.c's BOS, and ends at the next)")
        return 0
    try:
        path = export_torch(args.checkpoint, args.output, overwrite=args.overwrite)
    except USER_ERRORS as e:
        raise _Fail(e) from None
    _say(f"wrote {path}: load it in PyTorch with examples/torch_models.py's load_exported")
    return 0


def _cmd_warmup(args):
    import numpy as np

    from . import warmup
    dtypes = {"float32": (np.float32,), "float64": (np.float64,), "both": (np.float32, np.float64)}[args.dtype]
    calls = warmup.kernel_signatures(dtypes)
    live = sys.stdout.isatty()

    def progress(done, total, name):
        line = f"compiling kernels ({args.dtype}): {done}/{total} {name}".rstrip()
        if live:
            print("\r" + line.ljust(72), end="" if done < total else "\n", flush=True)
        elif done < total:
            _say(line)
    seconds = warmup.compile_kernels(calls, progress=progress)
    _say(f"{len(calls)} kernel signatures ready in {seconds:.1f} s (cache: {warmup.cache_dir()})")
    return 0


COMMANDS = {"train": _cmd_train, "resume": _cmd_resume, "sample": _cmd_sample, "decode": _cmd_decode,
            "export": _cmd_export, "warmup": _cmd_warmup}


def _silence_stdout():
    """Point stdout at /dev/null, so that the interpreter's final flush of a
    closed pipe does not print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in tests)
        pass


def main(argv=None, prog="tinygrad-attn"):
    """Run the command line with `argv` (default sys.argv[1:]); returns the
    exit status: 0 done, 1 diverged, 2 user error, 130 interrupted (Ctrl-C),
    141 output closed, 143 terminated (SIGTERM); after a training run's
    interruption its checkpoint is saved."""
    from .train.trainer import Terminated, TrainingDiverged
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's own parser, so the hint points at its --help
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    name = f"{prog} {args.command}"
    if args.command in ("train", "resume", "sample", "decode"):
        from .memory import keep_freed_memory
        keep_freed_memory()  # a program's choice (memory.py says why)
    if getattr(args, "threads", None):
        from .kernels.threads import set_num_threads
        set_num_threads(args.threads)
    try:
        return COMMANDS[args.command](args)
    except _Fail as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except TrainingDiverged as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except Terminated:  # during training the checkpoint is saved by then
        print(f"{name}: terminated", file=sys.stderr)
        return EXIT_SIGTERM
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except BrokenPipeError:
        _silence_stdout()
        trainer = getattr(args, "trainer", None)
        if trainer is not None and trainer.saved_step is not None:
            print(f"{name}: output closed; saved step {trainer.saved_step} to {trainer.checkpoint_path}",
                  file=sys.stderr)
        elif trainer is not None:
            print(f"{name}: output closed before the first checkpoint", file=sys.stderr)
        return EXIT_BROKEN_PIPE

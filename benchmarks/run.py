"""Benchmark the fused kernels against plain numpy and PyTorch (CPU, eager).

    PYTHONPATH=. python benchmarks/run.py [--repeat N] [--rounds R] [--threads N] [--skip-startup]
                                          [--only kernels|alternating|encoder|models|startup ...]

Prints, for each kernel and shape, the median milliseconds of a forward and
of a forward+backward call through the public API (Tensor in, Tensor out,
graph and all), the same work in plain numpy and in PyTorch when installed,
and the ratios numpy/ours and torch/ours (above 1: we are faster). Then:
a kernel alternating with a BLAS matmul against the two apart (idle threads
must not steal the cores BLAS needs); one post-norm Transformer encoder
layer, forward+backward, against torch.nn.TransformerEncoderLayer; a whole
training step of the two built-in models (the copy task's encoder-decoder,
the charlm GPT) against the same models, weights and optimizer in PyTorch;
and the start-up time (import + first training step) with an empty and with a warm
Numba cache. Timings on a shared machine are noisy: compare the ratios of
one run, and check `uptime` first. `--rounds R` measures everything R times,
interleaved, and keeps each one's best median (bursts of load from other
processes then spoil fewer rows). `--threads 1` runs everything (our
kernels, BLAS, PyTorch) on one thread: slower, but much steadier when other
processes compete for the cores.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--repeat", type=int, default=30, help="timed calls per measurement")
PARSER.add_argument("--rounds", type=int, default=None,
                    help="rounds per measurement, best median kept (default 2; 4 for the encoder and models)")
PARSER.add_argument("--threads", type=int, default=None, help="threads for kernels, BLAS and PyTorch")
PARSER.add_argument("--skip-startup", action="store_true", help="skip the start-up measurement")
PARSER.add_argument("--only", action="append", choices=["kernels", "alternating", "encoder", "models", "startup"],
                    help="run only this table (repeatable)")
ARGS = PARSER.parse_args()
if ARGS.threads:  # BLAS reads these when it loads, so before numpy is imported
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[name] = str(ARGS.threads)

try:  # before tinygrad_attn, so PyTorch's OpenMP runtime starts with its own defaults
    import torch
    if ARGS.threads:
        torch.set_num_threads(ARGS.threads)
except ImportError:
    torch = None

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import baselines as base  # noqa: E402
import tinygrad_attn as tg  # noqa: E402
from tinygrad_attn import functional as F  # noqa: E402
from tinygrad_attn import nn  # noqa: E402

REPEAT = ARGS.repeat


def median_ms(fn, repeat=None):
    """Median wall time of fn() in ms, after warm-up calls (which also compile)."""
    repeat = repeat or REPEAT
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def ours_case(fn, arrays, differentiable):
    """fwd (no graph) and fwd+bwd (backward of a gradient of ones, made once) of fn on our Tensors."""
    ts = [tg.Tensor(a, requires_grad=d) for a, d in zip(arrays, differentiable)]
    with tg.no_grad():
        ones = np.ones(fn(*ts).shape, np.float32)

    def fwd():
        with tg.no_grad():
            return fn(*ts)

    def fwd_bwd():
        fn(*ts).backward(ones)
        for t in ts:
            t.grad = None
    return fwd, fwd_bwd


def row(name, shape, ours, numpy_, torch_):
    ratio = lambda other: f"{other / ours:6.2f}" if other else "     -"
    t = f"{torch_:9.3f}" if torch_ else "        -"
    print(f"{name:26s} {shape:24s} {ours:9.3f} {numpy_:9.3f} {t}  {ratio(numpy_)}  {ratio(torch_)}")


def header(title):
    print(f"\n{title}")
    print(f"{'kernel':26s} {'shape':24s} {'ours ms':>9s} {'numpy ms':>9s} {'torch ms':>9s}  "
          f"{'np/ours':>6s}  {'pt/ours':>6s}")


def best_medians(*fns, repeat=None, rounds=None):
    """Each fn's best median over `rounds` rounds (default: --rounds or 2), the fns interleaved (None stays None)."""
    best = [None] * len(fns)
    for _ in range(rounds or ARGS.rounds or 2):
        for i, fn in enumerate(fns):
            if fn is not None:
                t = median_ms(fn, repeat)
                best[i] = t if best[i] is None else min(best[i], t)
    return best


def compare(name, shape_text, ours_fn, np_fns, torch_fn, arrays, differentiable):
    o_fwd, o_bwd = ours_case(ours_fn, arrays, differentiable)
    n_fwd, n_bwd = np_fns
    t_fwd = t_bwd = None
    if torch is not None and torch_fn is not None:
        t_fwd, t_bwd = base.torch_case(torch, torch_fn, arrays, differentiable)
    for suffix, o, n, t in ((" fwd", o_fwd, n_fwd, t_fwd), (" fwd+bwd", o_bwd, n_bwd, t_bwd)):
        row(name + suffix, shape_text, *best_medians(o, n, t))


def kernel_tables():
    rng = np.random.default_rng(0)
    f32 = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float32)
    tF = torch.nn.functional if torch is not None else None

    header("Kernels at the issue's shapes")
    a, b = f32(32, 8, 64, 64), f32(32, 8, 64, 64)
    compare("matmul (batched)", "(32,8,64,64)@same", lambda a, b: a @ b, base.np_matmul(a, b),
            lambda a, b: a @ b, (a, b), (True, True))
    x = f32(64, 8, 128, 128, s=3)
    compare("softmax", "(64,8,128,128)", lambda x: F.softmax(x, -1), base.np_softmax(x),
            lambda x: torch.softmax(x, -1), (x,), (True,))

    B, T, d, H, FF, V = 32, 64, 128, 4, 512, 1024
    header(f"Kernels at Transformer shapes (B={B}, T={T}, d={d}, {H} heads, ffn {FF})")
    x, w, bias = f32(B, T, d), f32(3 * d, d, s=0.1), f32(3 * d)
    compare("linear (in-proj)", f"({B},{T},{d})->{3 * d}", F.linear, base.np_linear(x, w, bias),
            lambda x, w, b: tF.linear(x, w, b), (x, w, bias), (True, True, True))
    q, k, v = f32(B, H, T, d // H), f32(B, H, T, d // H), f32(B, H, T, d // H)
    compare("matmul (Q K^T)", f"({B},{H},{T},{d // H})", lambda q, k: q @ k.swapaxes(-1, -2),
            base.np_matmul(q, np.swapaxes(k, -1, -2)), lambda q, k: q @ k.transpose(-1, -2), (q, k),
            (True, True))
    s = f32(B, H, T, T, s=3)
    compare("softmax", f"({B},{H},{T},{T})", lambda x: F.softmax(x, -1), base.np_softmax(s),
            lambda x: torch.softmax(x, -1), (s,), (True,))
    for causal in (False, True):
        compare("attention" + (" causal" if causal else ""), f"({B},{H},{T},{d // H})",
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                base.np_attention(q, k, v, causal),
                lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, is_causal=causal),
                (q, k, v), (True, True, True))
    ln_w, ln_b = f32(d), f32(d)
    compare("layer_norm", f"({B},{T},{d})", lambda x, w, b: F.layer_norm(x, (d,), w, b),
            base.np_layer_norm(x, ln_w, ln_b), lambda x, w, b: tF.layer_norm(x, (d,), w, b),
            (x, ln_w, ln_b), (True, True, True))
    logits, target = f32(B * T, V), rng.integers(0, V, B * T)
    compare("cross_entropy", f"({B * T},{V})", lambda x: F.cross_entropy(x, target),
            base.np_cross_entropy(logits, target),
            lambda x: tF.cross_entropy(x, torch.from_numpy(target)), (logits,), (True,))
    h = f32(B, T, FF)
    compare("dropout p=0.1", f"({B},{T},{FF})", lambda x: F.dropout(x, 0.1),
            base.np_dropout(h, 0.1, np.random.default_rng(0)), lambda x: tF.dropout(x, 0.1), (h,),
            (True,))


def alternating_table():
    """A kernel right after a BLAS matmul, and the other way round, must cost
    no more than the two apart: idle kernel threads must not take the cores
    BLAS needs. A numpy elementwise op alternating with the same matmul
    shows what alternating costs anyway (caches)."""
    rng = np.random.default_rng(1)
    rows, n = 4096, 256  # large enough that LayerNorm runs on all kernel threads
    x = tg.Tensor(rng.standard_normal((rows, n)).astype(np.float32))
    w, b = tg.Tensor(np.ones(n, np.float32)), tg.Tensor(np.zeros(n, np.float32))
    m = rng.standard_normal((n, n)).astype(np.float32)
    mm = lambda: x.data @ m
    print(f"\nA kernel alternating with a BLAS matmul ({rows}x{n} @ {n}x{n}), ms")
    print(f"{'op':26s} {'op':>7s} {'matmul':>7s} {'apart':>7s} {'alternating':>12s} {'ratio':>6s}")
    for name, op in (("layer_norm kernel", lambda: F.layer_norm(x, (n,), w, b)),
                     ("numpy x * 2 + 1 (control)", lambda: x.data * 2 + 1)):
        t_op, t_mm, t_both = best_medians(op, mm, lambda: (op(), mm()), repeat=100)
        print(f"{name:26s} {t_op:7.3f} {t_mm:7.3f} {t_op + t_mm:7.3f} {t_both:12.3f} "
              f"{t_both / (t_op + t_mm):6.2f}")


def encoder_layer_table():
    B, T, d, H, FF = 32, 64, 128, 4, 512
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, d)).astype(np.float32)
    g = rng.standard_normal((B, T, d)).astype(np.float32)
    print(f"\nOne post-norm encoder layer, forward+backward (B={B}, T={T}, d={d}, {H} heads, ffn {FF})")
    print(f"{'dropout':8s} {'ours ms':>9s} {'torch ms':>9s} {'pt/ours':>8s}")
    for p in (0.0, 0.1):
        ours = nn.TransformerEncoderLayer(d, H, FF, dropout=p, batch_first=True)
        ox = tg.Tensor(x, requires_grad=True)

        def ours_step():
            ours(ox).backward(g)
        torch_step = None
        if torch is not None:
            theirs = torch.nn.TransformerEncoderLayer(d, H, FF, dropout=p, batch_first=True)
            ours.load_state_dict(theirs.state_dict())
            tx, tgrad = torch.tensor(x, requires_grad=True), torch.tensor(g)
            if p == 0:
                diff = np.abs(ours(ox).data - theirs(tx).detach().numpy()).max()
                assert diff < 1e-4, f"encoder layers disagree by {diff}"

            def torch_step():
                theirs(tx).backward(tgrad)
        t_ours, t_torch = best_medians(ours_step, torch_step, rounds=ARGS.rounds or 4)  # the headline
        pt = f"{t_torch:9.2f} {t_torch / t_ours:8.2f}" if t_torch else "        -        -"
        print(f"{p:<8} {t_ours:9.2f} {pt}")


def _training_step(params, optimizer, loss_fn, clip_grad_norm):
    """One step as the trainer takes it: zero the gradients, loss, backward, clip to norm 1, AdamW."""
    def step():
        optimizer.zero_grad()
        loss_fn().backward()
        clip_grad_norm(params, 1.0)
        optimizer.step()
    return step


def models_table():
    """A whole training step of the built-in models at their CLI defaults,
    against the same model (same weights, checked) in PyTorch."""
    from tinygrad_attn import data, models, optim
    PAD = data.PAD
    rng = np.random.default_rng(3)
    copy = data.get_task("copy", num_symbols=10, length=10)
    batch = copy.train_batch(64)
    seq2seq = models.Seq2SeqTransformer(models.Seq2SeqConfig(vocab_size=copy.vocab_size, d_model=64, nhead=4,
                                        num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=256))
    gpt = models.GPT(models.GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128))
    idx = rng.integers(0, 65, (12, 64))
    target = rng.integers(0, 65, (12, 64))
    cases = [
        ("copy: Seq2SeqTransformer 2+2 layers d=64, batch 64x10", seq2seq,
         lambda m: m(batch.src, batch.tgt_in, batch.src_key_padding_mask, batch.tgt_key_padding_mask),
         batch.tgt_out, 0.01),
        ("charlm: GPT 4 layers d=128, batch 12x64", gpt, lambda m: m(idx), target, 0.1)]
    print("\nTraining step (forward, cross-entropy, backward, clip, AdamW) of the built-in models, float32")
    print(f"{'model':56s} {'ours ms':>9s} {'torch ms':>9s} {'pt/ours':>8s}")
    for name, model, run, target_ids, weight_decay in cases:
        params = list(model.parameters())
        opt = optim.AdamW(params, lr=1e-3, weight_decay=weight_decay)
        flat_target = target_ids.reshape(-1)

        def ours_loss():
            logits = run(model)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_target, ignore_index=PAD)
        ours_step = _training_step(params, opt, ours_loss, optim.clip_grad_norm_)
        torch_step = None
        if torch is not None:
            Seq2Seq, GPT = base.torch_models(torch)
            theirs = GPT(model.config) if model is gpt else Seq2Seq(model.config, model.pos.pe.numpy())
            theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
            as_torch = lambda a: torch.tensor(a) if a is not None else None
            if model is gpt:
                torch_run = lambda: theirs(as_torch(idx))
            else:
                torch_run = lambda: theirs(*map(as_torch, (batch.src, batch.tgt_in, batch.src_key_padding_mask,
                                                           batch.tgt_key_padding_mask)))
            with tg.no_grad(), torch.no_grad():
                diff = np.abs(run(model).numpy() - torch_run().numpy()).max()
            assert diff < 1e-4, f"{name}: the two models disagree by {diff}"
            tflat = as_torch(flat_target)
            t_params = list(theirs.parameters())
            t_opt = torch.optim.AdamW(t_params, lr=1e-3, weight_decay=weight_decay)

            def torch_loss():
                logits = torch_run()
                return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tflat,
                                                         ignore_index=PAD)
            torch_step = _training_step(t_params, t_opt, torch_loss, torch.nn.utils.clip_grad_norm_)
        t_ours, t_torch = best_medians(ours_step, torch_step, rounds=ARGS.rounds or 4)
        pt = f"{t_torch:9.2f} {t_torch / t_ours:8.2f}" if t_torch else "        -        -"
        print(f"{name:56s} {t_ours:9.2f} {pt}")


STARTUP = """
import time
start = time.perf_counter()
import numpy as np
import tinygrad_attn as tg
from tinygrad_attn import nn, functional as F
imported = time.perf_counter()
tg.manual_seed(0)
layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
head = nn.Linear(32, 11)
x = tg.randn(4, 10, 32)
logits = head(layer(x))
loss = F.cross_entropy(logits.reshape(-1, 11), np.arange(40) % 11)
loss.backward()
done = time.perf_counter()
print(f"{imported - start:.2f} {done - start:.2f}", flush=True)
"""


def startup_table():
    """Import + one forward/backward of a small Transformer layer and loss, in
    a fresh process: with an empty Numba cache (with and without the
    background compile of kernels/precompile.py), then with it filled."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Python's bytecode cache on, as in an installed package (pip writes it at install time)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = root
    subprocess.run([sys.executable, "-c", "import tinygrad_attn"], check=True,  # writes it, compiles nothing
                   env=dict(env, TINYGRAD_ATTN_PRECOMPILE="0"))
    print("\nStart-up: import + first forward/backward of a small encoder layer and loss")
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as other_cache:
        runs = (("cold (empty Numba cache)", cache, "1"), ("warm (cached kernels)", cache, "1"),
                ("warm again", cache, "1"), ("cold, no background compile", other_cache, "0"))
        for label, directory, background in runs:
            out = subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True, check=True,
                                 env=dict(env, NUMBA_CACHE_DIR=directory,
                                          TINYGRAD_ATTN_PRECOMPILE=background)).stdout.split()
            print(f"  {label:28s} import {out[0]} s, import + first step {out[1]} s")


def main():
    print(f"numpy {np.__version__}, torch {torch.__version__ if torch else 'not installed'}, "
          f"{os.cpu_count()} cores, kernel threads {tg.ops.kernels.get_num_threads()}, "
          f"torch threads {torch.get_num_threads() if torch else '-'}, BLAS {tg.ops.kernels.blas_name()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    tables = {"kernels": kernel_tables, "alternating": alternating_table, "encoder": encoder_layer_table,
              "models": models_table, "startup": startup_table}
    for name, table in tables.items():
        if (ARGS.only is None and not (name == "startup" and ARGS.skip_startup)) or name in (ARGS.only or ()):
            table()


if __name__ == "__main__":
    main()

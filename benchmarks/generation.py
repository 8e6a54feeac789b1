"""Generation speed with and without the key/value cache.

    PYTHONPATH=. python benchmarks/generation.py [--length N] [--sequences N] [--rounds R]
                                                 [--threads N] [--seed S]

The charlm model of the command line's defaults (4 blocks, n_embd 128, 4
heads, block_size 64, 65 characters, GPT initialisation: speed does not
depend on what the weights learned) generates `--length` ids from a
one-id prompt (the `sample` command's "\\n") at temperature 0.8, top_k None,
batch 1, three ways:

- nanoGPT's rule, as `GPT.generate` did before the cache: every step runs
  the model on the last block_size ids (reproduced here, `nanogpt_generate`);
- the same rule, but with the numpy forward the cached path uses
  (`generation.gpt_step` on a fresh cache at every step): how much of the
  gain is only numpy instead of Tensor ops;
- `generate(use_cache=False)`: the windowed rule (a full window restarts from
  its last block_size // 2 ids), the whole window through forward each step;
- `generate(use_cache=True)` (the default): the same rule, one position per
  step against the cache.

Then the copy task's encoder-decoder (command-line defaults) decodes
`--sequences` of its held-out sequences (1,000, as the training run's
evaluation) in one batch with `greedy_decode(use_cache=False / True)`.
Prints tokens (or sequences) per second, the best of `--rounds` interleaved
rounds (other processes on a shared machine slow some rounds down), the
ratios, and whether the cached and uncached paths produced the same ids.
`--threads 1` runs kernels and BLAS on one thread: steadier when other
processes compete for the cores.
"""
import argparse
import os
import time

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--length", type=int, default=500, help="new ids per sample (default 500)")
PARSER.add_argument("--sequences", type=int, default=1000, help="seq2seq sequences to decode (default 1000)")
PARSER.add_argument("--rounds", type=int, default=3, help="timed rounds, best kept (default 3)")
PARSER.add_argument("--threads", type=int, default=None, help="threads for kernels and BLAS")
PARSER.add_argument("--seed", type=int, default=0, help="weights and sampling seed (default 0)")
ARGS = PARSER.parse_args()
if ARGS.threads:  # BLAS reads these when it loads, so before numpy is imported
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[name] = str(ARGS.threads)

import numpy as np  # noqa: E402

import tinygrad_attn as tg  # noqa: E402
from tinygrad_attn import data, generation  # noqa: E402
from tinygrad_attn.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer, _sample  # noqa: E402
from tinygrad_attn.train.config import TASK_DEFAULTS  # noqa: E402


def nanogpt_generate(model, idx, max_new_tokens, temperature, top_k, rng):
    """GPT.generate before the cache: crop to the last block_size ids, run
    the whole model, sample from the last position, at every step."""
    model.eval()
    with tg.no_grad():
        for _ in range(max_new_tokens):
            logits = model(idx[:, -model.config.block_size:]).data[:, -1].astype(np.float64)
            idx = np.concatenate([idx, _sample(logits, temperature, top_k, rng)[:, None]], axis=1)
    return idx


def nanogpt_numpy_generate(model, idx, max_new_tokens, temperature, top_k, rng):
    """nanoGPT's rule again, each step's forward run by the cached path's
    numpy code on a fresh cache (it encodes the whole context at once)."""
    block = model.config.block_size
    for _ in range(max_new_tokens):
        caches = generation.caches_for(model.transformer.layers, len(idx), block, model.tok_emb.weight.dtype)
        logits = generation.gpt_step(model, idx[:, -block:], caches).astype(np.float64)
        idx = np.concatenate([idx, _sample(logits, temperature, top_k, rng)[:, None]], axis=1)
    return idx


def best_rate(runs, count, rounds):
    """{name: best count/second} over `rounds` interleaved rounds of each run, and the last outputs."""
    rates, outputs = {name: 0.0 for name in runs}, {}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run()
            rates[name] = max(rates[name], count / (time.perf_counter() - start))
    return rates, outputs


def report(title, unit, rates, baseline):
    print(title)
    for name, rate in rates.items():
        print(f"  {name:<44} {rate:9.1f} {unit}/s   {rate / rates[baseline]:5.2f}x")


def main():
    args = ARGS
    d = TASK_DEFAULTS["charlm"]
    tg.manual_seed(args.seed)
    gpt = GPT(GPTConfig(vocab_size=65, block_size=d["seq_len"], n_layer=d["layers"], n_head=d["heads"],
                        n_embd=d["d_model"], dim_feedforward=d["ffn"]))
    prompt = np.zeros((1, 1), np.int64)
    settings = dict(temperature=0.8, top_k=None)

    def sample(use_cache):
        return lambda: gpt.generate(prompt, args.length, **settings, use_cache=use_cache,
                                    generator=np.random.default_rng(args.seed))

    runs = {"nanoGPT rule, whole context every step": lambda: nanogpt_generate(
                gpt, prompt, args.length, **settings, rng=np.random.default_rng(args.seed)),
            "nanoGPT rule, numpy forward of the context": lambda: nanogpt_numpy_generate(
                gpt, prompt, args.length, **settings, rng=np.random.default_rng(args.seed)),
            "windowed rule, use_cache=False": sample(False),
            "windowed rule, use_cache=True": sample(True)}
    for use_cache in (False, True):  # warm-up: compile or load the kernels, past one window restart
        gpt.generate(prompt, 70, use_cache=use_cache)
    rates, outputs = best_rate(runs, args.length, args.rounds)
    c = gpt.config
    report(f"charlm GPT ({c.n_layer} blocks, n_embd {c.n_embd}, {c.n_head} heads, block_size "
           f"{c.block_size}): {args.length} new ids, batch 1, temperature 0.8", "tokens", rates,
           "nanoGPT rule, whole context every step")
    names = list(runs)
    same = (outputs[names[2]] == outputs[names[3]]).all()
    print(f"  same ids with and without the cache: {'yes' if same else 'NO'}")
    same = (outputs[names[0]] == outputs[names[1]]).all()
    print(f"  same ids from the Tensor and the numpy forward (nanoGPT rule): {'yes' if same else 'NO'}")

    d = TASK_DEFAULTS["copy"]
    task = data.get_task("copy", num_symbols=d["vocab"], length=d["seq_len"])
    src = task.held_out_batch(args.sequences).src
    tg.manual_seed(args.seed)
    s2s = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=task.vocab_size, d_model=d["d_model"], nhead=d["heads"],
                                           num_encoder_layers=d["layers"], num_decoder_layers=d["layers"],
                                           dim_feedforward=d["ffn"]))
    runs = {"greedy_decode(use_cache=False)": lambda: s2s.greedy_decode(src, use_cache=False),
            "greedy_decode(use_cache=True)": lambda: s2s.greedy_decode(src, use_cache=True)}
    for run in runs.values():
        run()
    rates, outputs = best_rate(runs, len(src), args.rounds)
    report(f"copy Seq2SeqTransformer ({d['layers']} + {d['layers']} layers, d_model {d['d_model']}): "
           f"{len(src)} held-out sequences of {d['seq_len']} symbols in one batch", "sequences", rates,
           "greedy_decode(use_cache=False)")
    same = (outputs["greedy_decode(use_cache=False)"] == outputs["greedy_decode(use_cache=True)"]).all()
    print(f"  same ids with and without the cache: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()

"""The benchmark cases in tinygrad_attn (run inside a worker, see worker.py).

`init(case, path)` draws a case's inputs and initial weights and writes them
to `path` (.npz: "in.NAME" inputs, "w.NAME" our state_dict, "buf.NAME"
buffers a twin needs, such as the sinusoidal table); `build(case, path)`
builds the case from that file and returns a `cases.Built`. impl_torch.py builds
the same cases from the same file.
"""
import inspect
import os
import re
import zlib

import numpy as np

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import models, nn, optim

import baselines
import cases as C
import kernel_rows

NAME = "tinygrad_attn"

# Our worker runs as a training program does: `train` and the other commands
# keep freed memory for reuse (tinygrad_attn/memory.py), and so should a
# training script. TINYGRAD_ATTN_BENCH_MEMORY=default measures without it.
KEEP_MEMORY = os.environ.get("TINYGRAD_ATTN_BENCH_MEMORY", "keep") == "keep" and \
    bool(getattr(tg, "keep_freed_memory", lambda: False)())


def set_threads(n):
    # tinygrad_attn.set_num_threads (our pool and BLAS) once it exists, the kernels' pool before.
    (getattr(tg, "set_num_threads", None) or _kernels().set_num_threads)(n)


def info():
    import numba
    get = getattr(tg, "get_num_threads", None) or _kernels().get_num_threads
    return {"name": NAME, "versions": f"numpy {np.__version__}, numba {numba.__version__}",
            "blas": f"{_blas_name()} ({baselines.numpy_blas()})",
            "threads": f"kernel threads {get()}, numba threads {numba.config.NUMBA_NUM_THREADS}",
            "memory": "keep_freed_memory()" if KEEP_MEMORY else "malloc's defaults"}


def _kernels():  # tinygrad_attn.kernels, or tinygrad_attn.ops.kernels in older checkouts (before/after runs)
    return getattr(tg, "kernels", None) or tg.ops.kernels


def _blas_name():  # BLAS_NAME: versions before the kernel-runtime change (before/after runs)
    k = _kernels()
    return k.blas_name() if hasattr(k, "blas_name") else f"{k.BLAS_NAME}'s"


# ------------------------------------------------------------ the models

class EncoderLM(nn.Module):
    """W1: Embedding + sinusoidal positions + post-norm encoder layers + Linear."""

    def __init__(self):
        super().__init__()
        c = C.W1
        self.embed = nn.Embedding(num_embeddings=c["vocab"], embedding_dim=c["d_model"])
        self.pos = nn.PositionalEncoding(d_model=c["d_model"], max_len=c["seq"], dropout=0.0)
        layer = nn.TransformerEncoderLayer(d_model=c["d_model"], nhead=c["nhead"], dim_feedforward=c["ffn"],
                                           dropout=0.0, activation="relu", batch_first=True,
                                           norm_first=False)
        self.encoder = nn.TransformerEncoder(encoder_layer=layer, num_layers=c["layers"])
        self.head = nn.Linear(in_features=c["d_model"], out_features=c["vocab"])

    def forward(self, ids):
        return self.head(self.encoder(self.pos(self.embed(ids))))


def tanh_gelu(x):
    return F.gelu(x, approximate="tanh")


def _gpt():
    """W2: our GPT at nanoGPT's CPU configuration, with the tanh GELU (versions
    without GPTConfig.gelu, measured for before/after, get it block by block)."""
    c = C.W2
    config = dict(vocab_size=c["vocab"], block_size=c["block"], n_layer=c["n_layer"], n_head=c["n_head"],
                  n_embd=c["n_embd"], dropout=0.0, bias=True, tie_weights=True)
    try:
        return models.GPT(models.GPTConfig(**config, gelu="tanh"))
    except TypeError:
        model = models.GPT(models.GPTConfig(**config))
        for block in model.transformer.layers:
            block.activation = tanh_gelu
        return model


def _mha():
    c = C.W3
    return nn.MultiheadAttention(embed_dim=c["embed_dim"], num_heads=c["num_heads"], dropout=0.0, bias=True,
                                 batch_first=True)


def _copy_model(vocab_size):
    c = C.COPY
    return models.Seq2SeqTransformer(models.Seq2SeqConfig(
        vocab_size=vocab_size, d_model=c["d_model"], nhead=c["nhead"], num_encoder_layers=c["layers"],
        num_decoder_layers=c["layers"], dim_feedforward=c["ffn"], dropout=0.0))


def _encoder_layer(p):
    c = C.ENCODER
    return nn.TransformerEncoderLayer(d_model=c["d_model"], nhead=c["nhead"], dim_feedforward=c["ffn"],
                                      dropout=p, activation="relu", batch_first=True, norm_first=False)


# ------------------------------------------------------------ init: the shared file

def _rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def _weights(model):
    return {f"w.{k}": v.numpy() for k, v in model.state_dict().items()}


def init(case, path):
    """Draw the inputs and weights of `case` and write them to `path`."""
    tg.manual_seed(0)
    name = C.files_of(case)
    rng = _rng(name)
    kind = case.partition(":")[0]
    if case == "W1":
        c = C.W1
        model = EncoderLM()
        arrays = {"in.ids": rng.integers(0, c["vocab"], (c["batch"], c["seq"])),
                  "in.target": rng.integers(0, c["vocab"], (c["batch"], c["seq"])),
                  "buf.pe": model.pos.pe.numpy(), **_weights(model)}
    elif case == "W2":
        c = C.W2
        arrays = {"in.idx": rng.integers(0, c["vocab"], (c["batch"], c["block"])),
                  "in.target": rng.integers(0, c["vocab"], (c["batch"], c["block"])), **_weights(_gpt())}
    elif case == "llama":
        arrays = init_llama(rng)
    elif case == "W3":
        c = C.W3
        arrays = {"in.x": rng.standard_normal((c["batch"], c["seq"], c["embed_dim"]), np.float32),
                  **_weights(_mha())}
    elif case == "copy":
        from tinygrad_attn import data
        task = data.get_task("copy", num_symbols=C.COPY["num_symbols"], length=C.COPY["length"])
        batch = task.train_batch(C.COPY["batch"])
        model = _copy_model(task.vocab_size)
        arrays = {"in.src": batch.src, "in.tgt_in": batch.tgt_in, "in.tgt_out": batch.tgt_out,
                  "in.src_key_padding_mask": batch.src_key_padding_mask,
                  "in.tgt_key_padding_mask": batch.tgt_key_padding_mask,
                  "in.vocab_size": np.array(task.vocab_size), "in.ignore_index": np.array(data.PAD),
                  "buf.pe": model.pos.pe.numpy(), **_weights(model)}
    elif kind == "enc":
        c = C.ENCODER
        shape = (c["batch"], c["seq"], c["d_model"])
        arrays = {"in.x": rng.standard_normal(shape, np.float32), "in.g": rng.standard_normal(shape, np.float32),
                  **_weights(_encoder_layer(0.0))}
    elif kind == "kernel":
        return _init_kernel(case.split(":")[1], path, rng)
    elif kind == "optim":
        arrays = {}
        for i, shape in enumerate(C.OPTIM_SHAPES):
            arrays[f"in.p{i}"] = rng.standard_normal(shape).astype(np.float32)
            arrays[f"in.g{i}"] = rng.standard_normal(shape).astype(np.float32)
    elif kind == "alt":
        rows, n = C.ALTERNATING["rows"], C.ALTERNATING["n"]
        arrays = {"in.x": rng.standard_normal((rows, n)).astype(np.float32),
                  "in.m": rng.standard_normal((n, n)).astype(np.float32)}
    else:
        raise KeyError(f"unknown case {case!r}")
    np.savez(path, **arrays)


# ------------------------------------------------------------ build

def _load(path, prefix):
    with np.load(path) as f:
        return {k[len(prefix):]: f[k] for k in f.files if k.startswith(prefix)}


def _train_check(train, forward):
    """The forward output on the initial weights, then the loss of CHECK_STEPS steps."""
    def check():
        with tg.no_grad():
            out = forward().numpy()
        losses = [float(train().item()) for _ in range(C.CHECK_STEPS)]
        return {"out": out, "losses": np.array(losses)}
    return check


def build(case, path):
    inputs = _load(path, "in.")
    weights = _load(path, "w.")
    kind, _, rest = case.partition(":")
    if case in C.WORKLOADS:
        return _WORKLOAD_BUILDERS[case](inputs, weights)
    if kind == "enc":
        return _encoder(float(rest), inputs, weights)
    if kind == "kernel":
        key, mode = rest.split(":")
        return _kernel(key, mode, path)
    if kind == "optim":
        return _optimizer(rest, inputs)
    if kind == "alt":
        return _alternating(rest, inputs)
    raise KeyError(f"unknown case {case!r}")


def _language_model(model, weights, ids, target, optimizer, clip=False):
    """A step of a model from token ids to logits, cross-entropy against target."""
    model.load_state_dict(weights)
    target = target.reshape(-1)
    forward = lambda: model(ids)

    def loss_fn():
        logits = forward()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)
    params = list(model.parameters())
    train = C.TrainStep(loss_fn, optimizer(params), **(dict(clip=optim.clip_grad_norm_, params=params) if clip else {}))
    return C.Built(train, _train_check(train, forward), train)


def _w1(inputs, weights):
    return _language_model(EncoderLM(), weights, inputs["ids"], inputs["target"],
                           lambda params: optim.Adam(params, lr=C.W1["lr"]))


def _w2(inputs, weights):
    return _language_model(_gpt(), weights, inputs["idx"], inputs["target"],
                           lambda params: optim.AdamW(params, lr=C.W2["lr"], weight_decay=C.W2["weight_decay"]),
                           clip=True)


def _w3(inputs, weights):
    mha = _mha()
    mha.load_state_dict(weights)
    x = tg.Tensor(inputs["x"], requires_grad=True)

    def zero_grad():
        x.grad = None
        mha.zero_grad()

    def loss_fn():
        out, _ = mha(x, x, x, need_weights=False)
        return out.sum()
    train = C.TrainStep(loss_fn, zero_grad=zero_grad)

    def check():
        with tg.no_grad():
            out = mha(x, x, x, need_weights=False)[0].numpy()
        train()
        return {"out": out, "grad.x": x.grad.numpy(), "grad.in_proj_weight": mha.in_proj_weight.grad.numpy(),
                "grad.in_proj_bias": mha.in_proj_bias.grad.numpy(),
                "grad.out_proj.weight": mha.out_proj.weight.grad.numpy()}
    return C.Built(train, check, train)


def _copy(inputs, weights):
    model = _copy_model(int(inputs["vocab_size"]))
    model.load_state_dict(weights)
    target = inputs["tgt_out"].reshape(-1)
    ignore = int(inputs["ignore_index"])
    forward = lambda: model(inputs["src"], inputs["tgt_in"], inputs["src_key_padding_mask"],
                            inputs["tgt_key_padding_mask"])

    def loss_fn():
        logits = forward()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, ignore_index=ignore)
    params = list(model.parameters())
    opt = optim.AdamW(params, lr=C.COPY["lr"], weight_decay=C.COPY["weight_decay"])
    train = C.TrainStep(loss_fn, opt, clip=optim.clip_grad_norm_, params=params)
    return C.Built(train, _train_check(train, forward), train)


_WORKLOAD_BUILDERS = {"W1": _w1, "W2": _w2, "W3": _w3, "copy": _copy}


def _encoder(p, inputs, weights):
    layer = _encoder_layer(p)
    layer.load_state_dict(weights)
    x = tg.Tensor(inputs["x"], requires_grad=True)
    g = inputs["g"]

    def step():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(g)

    def check():
        if p:  # different random masks in each framework: nothing to compare
            return {}
        with tg.no_grad():
            return {"out": layer(x).numpy()}
    return C.Built(step, check)


# ------------------------------------------------------------ kernels

def ops_with_kernels():
    """The registered ops that run a kernel: those that declare an `example` (autograd.Function)."""
    return {name: op for name, op in tg.Function.registry.items() if op.example is not None}


def _shape_text(arrays):
    return str(tuple(arrays[0].shape)).replace(" ", "") + (f"+{len(arrays) - 1}" if len(arrays) > 1 else "")


def kernel_cases(size):
    """A row for every op with a kernel, built from its example(float32, size):
    [{"key", "label", "shape"}] (the shape of its first array, +N others)."""
    rows = []
    for name, op in ops_with_kernels().items():
        arrays, _ = op.example(np.float32, size)
        rows.append({"key": C.example_row(name, size), "label": name, "shape": _shape_text(arrays)})
    return rows


def twin_name(op):
    """The name of op's numpy twin, from its docstring ("Readable version:
    tinygrad_attn.reference.numpy_backward.silu_backward" gives "silu"), or None."""
    found = re.search(r"tinygrad_attn\.reference\.numpy_backward\.(\w+)_backward", op.__doc__ or "")
    return found.group(1) if found else None


def _draw(d, rng):
    return rng.integers(0, d.scale, d.shape) if d.kind == "i" else (rng.standard_normal(d.shape) * d.scale).astype(
        np.float32)


def _row_inputs(key, rng):
    """(op, arrays, params, which arrays require grad, prep) of a kernel row:
    the op's example(float32, size) (as the warm-up runs it: floating arrays
    require grad), or a row of cases.KERNELS, drawn."""
    example = C.example_of(key)
    if example is not None:
        name, size = example
        op = tg.Function.registry[name]
        arrays, params = op.example(np.float32, size)
        return op, list(arrays), dict(params), [a.dtype.kind == "f" for a in arrays], None
    row = C.KERNELS[key]
    params = {k: _draw(v, rng) if isinstance(v, C.Draw) else v for k, v in row.params.items()}
    return tg.Function.registry[row.op], [_draw(d, rng) for d in row.inputs], params, [d.grad for d in row.inputs], \
        row.prep


def _forward_arguments(op, n_arrays, params):
    """(the names forward gives op's n_arrays arrays, params with forward's
    defaults filled in). `seed` is left out: it fixes an op's random numbers
    (tests use it); a row draws them at each call, as training does."""
    after_ctx = list(inspect.signature(op.forward).parameters.values())[1:]
    names = [p.name for p in after_ctx[:n_arrays]]
    full = {p.name: p.default for p in after_ctx[n_arrays:] if p.default is not inspect.Parameter.empty}
    full.update(params)
    full.pop("seed", None)
    return names, full


def _repeat_kv(ts):
    """Grouped-query attention through a copy: the key and value heads repeated for the
    query heads sharing them, by ops.movement.repeat_kv_heads (what F.scaled_dot_product_attention
    did before the kernel read shared heads in place; its backward sums each group)."""
    try:  # imported here: a --before checkout may have it in reference, or none
        from tinygrad_attn.ops.movement import repeat_kv_heads
    except ImportError:
        from tinygrad_attn.reference import repeat_kv_heads
    q, k, v, *rest = ts
    return [q, repeat_kv_heads(q, k), repeat_kv_heads(q, v), *rest]


# How a row's arrays reach the op (cases.Row.prep), through our ops.
PREP = {None: lambda ts: ts, "transpose_b": lambda ts: [ts[0], ts[1].swapaxes(-1, -2), *ts[2:]],
        "repeat_kv": _repeat_kv}


def _init_kernel(key, path, rng):
    """Write a kernel row's file (kernel_rows.py): the arrays, the parameters, a
    random gradient of the output's shape (not ones: softmax's gradient of ones
    is 0), and whether the op is random (two calls on the same inputs differ)."""
    op, arrays, params, grads, prep = _row_inputs(key, rng)
    names, params = _forward_arguments(op, len(arrays), params)
    with tg.no_grad():
        ts = PREP[prep]([tg.Tensor(a) for a in arrays])
        out, again = (op.apply(*ts, **params).numpy() for _ in range(2))
    random = not np.array_equal(out, again, equal_nan=True)
    meta = dict(op=op.__name__, names=names, grads=grads, prep=prep, twin=twin_name(op), random=random)
    kernel_rows.save(path, arrays, params, rng.standard_normal(out.shape).astype(out.dtype), meta)


def _kernel(key, mode, path):
    row = kernel_rows.Row(path)
    op, prep = tg.Function.registry[row.op], PREP[row.meta["prep"]]
    ts = [tg.Tensor(a, requires_grad=g) for a, g in zip(row.arrays, row.grads)]

    def fwd():
        with tg.no_grad():
            return op.apply(*prep(ts), **row.params)

    def fwd_bwd():
        for t in ts:
            t.grad = None
        op.apply(*prep(ts), **row.params).backward(row.grad)

    def check():
        out = fwd().numpy()
        if mode == "fwd":
            return kernel_rows.check(row, out)
        fwd_bwd()
        return kernel_rows.check(row, out, [None if t.grad is None else t.grad.numpy() for t in ts])
    return C.Built(fwd if mode == "fwd" else fwd_bwd, check)


# ------------------------------------------------------------ optimizers

def _optimizer(key, inputs):
    _, cls, kwargs = C.OPTIMIZERS[key]
    n = len(C.OPTIM_SHAPES)
    params = [tg.Tensor(inputs[f"p{i}"].copy(), requires_grad=True) for i in range(n)]
    for i, p in enumerate(params):
        p.grad = tg.Tensor(inputs[f"g{i}"])
    opt = getattr(optim, cls)(params, **kwargs)

    def check():
        # The parameters after the steps. (Their float32 changes, p - p0, would carry the
        # rounding of p, ~1e-5 of the change; a wrong update moves p by ~1e-3 of its size.)
        for _ in range(C.CHECK_STEPS):
            opt.step()
        return {f"p{i}": p.numpy().copy() for i, p in enumerate(params)}
    return C.Built(opt.step, check)


# ------------------------------------------------------------ alternating (ours only)

def _alternating(key, inputs):
    """A LayerNorm kernel (or a numpy elementwise op, the control) and a BLAS
    matmul, alone and in turn: idle kernel threads must not take the cores BLAS needs."""
    x_arr, m = inputs["x"], inputs["m"]
    n = x_arr.shape[1]
    x = tg.Tensor(x_arr)
    w, b = tg.Tensor(np.ones(n, np.float32)), tg.Tensor(np.zeros(n, np.float32))
    ops = {"ln": lambda: F.layer_norm(x, (n,), w, b), "np": lambda: x_arr * 2 + 1, "mm": lambda: x_arr @ m}
    parts = [ops[k] for k in key.split("+")]

    def step():
        for part in parts:
            part()
    return C.Built(step, dict)


def profile(built, steps):
    import instrument
    return instrument.profile(built.train, steps)


# ------------------------------------------------------------ Llama

def _llama_model():
    c = C.LLAMA
    return models.Llama(models.LlamaConfig(dim=c["dim"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                                           n_kv_heads=c["n_kv_heads"], vocab_size=c["vocab_size"],
                                           multiple_of=c["multiple_of"], max_seq_len=c["max_seq_len"]))


def init_llama(rng):
    c = C.LLAMA
    shape = (c["batch"], c["max_seq_len"])
    return {"in.idx": rng.integers(0, c["vocab_size"], shape), "in.target": rng.integers(0, c["vocab_size"], shape),
            **_weights(_llama_model())}


def _llama(inputs, weights):
    return _language_model(_llama_model(), weights, inputs["idx"], inputs["target"],
                           lambda params: optim.AdamW(params, lr=C.LLAMA["lr"],
                                                      weight_decay=C.LLAMA["weight_decay"]), clip=True)


_WORKLOAD_BUILDERS["llama"] = _llama

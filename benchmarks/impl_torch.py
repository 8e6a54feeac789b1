"""The benchmark cases in PyTorch (run inside a worker, see worker.py), built
from the files impl_ours.init wrote: the same inputs, the same weights."""
import re
import statistics
import time

import numpy as np
import torch

import baselines
import cases as C
import kernel_rows

NAME = "torch"
TF = torch.nn.functional
TWINS = baselines.torch_models(torch)


def set_threads(n):
    torch.set_num_threads(n)


def info():
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = found.group(1) if found else "unknown"
    return {"name": NAME, "versions": f"torch {torch.__version__}, numpy {np.__version__}", "blas": blas,
            "threads": f"torch threads {torch.get_num_threads()}, interop {torch.get_num_interop_threads()}"}


def _load(path, prefix):
    with np.load(path) as f:
        return {k[len(prefix):]: f[k] for k in f.files if k.startswith(prefix)}


def _state(weights):
    return {k: torch.from_numpy(v) for k, v in weights.items()}


def build(case, path):
    inputs, weights, buffers = _load(path, "in."), _load(path, "w."), _load(path, "buf.")
    kind, _, rest = case.partition(":")
    if case in C.WORKLOADS:
        return _WORKLOAD_BUILDERS[case](inputs, weights, buffers)
    if kind == "enc":
        return _encoder(float(rest), inputs, weights)
    if kind == "kernel":
        key, mode = rest.split(":")
        return _kernel(key, mode, path)
    if kind == "optim":
        return _optimizer(rest, inputs)
    raise KeyError(f"case {case!r} has no PyTorch version")


def _train_check(train, forward):
    def check():
        with torch.no_grad():
            out = forward().numpy()
        losses = [float(train().item()) for _ in range(C.CHECK_STEPS)]
        return {"out": out, "losses": np.array(losses)}
    return check


def _lm_loss(forward, target, **kwargs):
    def loss_fn():
        logits = forward()
        return TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), target, **kwargs)
    return loss_fn


def _w1(inputs, weights, buffers):
    c = C.W1
    model = TWINS.EncoderLM(vocab=c["vocab"], d_model=c["d_model"], nhead=c["nhead"], ffn=c["ffn"],
                            layers=c["layers"], pe=buffers["pe"])
    model.load_state_dict(_state(weights))
    ids, target = torch.from_numpy(inputs["ids"]), torch.from_numpy(inputs["target"].reshape(-1))
    forward = lambda: model(ids)
    train = C.TrainStep(_lm_loss(forward, target), torch.optim.Adam(model.parameters(), lr=c["lr"]))
    return C.Built(train, _train_check(train, forward), train)


def tanh_gelu(x):
    return TF.gelu(x, approximate="tanh")


def _w2(inputs, weights, buffers):
    c = C.W2
    model = TWINS.GPT(vocab=c["vocab"], block=c["block"], n_layer=c["n_layer"], n_head=c["n_head"],
                      n_embd=c["n_embd"], activation=tanh_gelu, bias=True)
    model.load_state_dict(_state(weights))
    idx, target = torch.from_numpy(inputs["idx"]), torch.from_numpy(inputs["target"].reshape(-1))
    forward = lambda: model(idx)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=c["lr"], weight_decay=c["weight_decay"])
    train = C.TrainStep(_lm_loss(forward, target), opt, clip=torch.nn.utils.clip_grad_norm_, params=params)
    return C.Built(train, _train_check(train, forward), train)


def _w3(inputs, weights, buffers):
    c = C.W3
    mha = torch.nn.MultiheadAttention(embed_dim=c["embed_dim"], num_heads=c["num_heads"], dropout=0.0, bias=True,
                                      batch_first=True)
    mha.load_state_dict(_state(weights))
    x = torch.tensor(inputs["x"], requires_grad=True)

    def zero_grad():
        x.grad = None
        mha.zero_grad()

    def loss_fn():
        out, _ = mha(x, x, x, need_weights=False)
        return out.sum()
    train = C.TrainStep(loss_fn, zero_grad=zero_grad)

    def check():
        with torch.no_grad():
            out = mha(x, x, x, need_weights=False)[0].numpy()
        train()
        return {"out": out, "grad.x": x.grad.numpy(), "grad.in_proj_weight": mha.in_proj_weight.grad.numpy(),
                "grad.in_proj_bias": mha.in_proj_bias.grad.numpy(),
                "grad.out_proj.weight": mha.out_proj.weight.grad.numpy()}
    return C.Built(train, check, train)


def _copy(inputs, weights, buffers):
    c = C.COPY
    model = TWINS.Seq2Seq(vocab_size=int(inputs["vocab_size"]), d_model=c["d_model"], nhead=c["nhead"],
                          layers=c["layers"], ffn=c["ffn"], pe=buffers["pe"])
    model.load_state_dict(_state(weights))
    src, tgt_in = torch.from_numpy(inputs["src"]), torch.from_numpy(inputs["tgt_in"])
    src_pad = torch.from_numpy(inputs["src_key_padding_mask"])
    tgt_pad = torch.from_numpy(inputs["tgt_key_padding_mask"])
    target = torch.from_numpy(inputs["tgt_out"].reshape(-1))
    forward = lambda: model(src, tgt_in, src_pad, tgt_pad)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=c["lr"], weight_decay=c["weight_decay"])
    train = C.TrainStep(_lm_loss(forward, target, ignore_index=int(inputs["ignore_index"])), opt,
                        clip=torch.nn.utils.clip_grad_norm_, params=params)
    return C.Built(train, _train_check(train, forward), train)


_WORKLOAD_BUILDERS = {"W1": _w1, "W2": _w2, "W3": _w3, "copy": _copy}


def _encoder(p, inputs, weights):
    c = C.ENCODER
    layer = torch.nn.TransformerEncoderLayer(d_model=c["d_model"], nhead=c["nhead"], dim_feedforward=c["ffn"],
                                             dropout=p, activation="relu", batch_first=True, norm_first=False)
    layer.load_state_dict(_state(weights))
    x = torch.tensor(inputs["x"], requires_grad=True)
    g = torch.from_numpy(inputs["g"])

    def step():
        x.grad = None
        layer.zero_grad()
        layer(x).backward(g)

    def check():
        if p:
            return {}
        with torch.no_grad():
            return {"out": layer(x).numpy()}
    return C.Built(step, check)


# ------------------------------------------------------------ kernel rows
# The PyTorch twin of an op (its class name): called as Op.apply is, with the
# op's arrays as tensors and its parameters by the op's names (the op's
# defaults filled in; array parameters as tensors). An op with none gets its
# row all the same, ours against numpy, marked "no PyTorch twin".

def _sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, enable_gqa=False):
    return TF.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                           scale=scale, enable_gqa=enable_gqa)


def _packed_self_attention(qkv, attn_mask=None, num_heads=1, is_causal=False, scale=None, dropout_p=0.0):
    """qkv (B, T, 3 * H * hd), its last axis laid out (3, H, hd): attention per head, heads side by side."""
    B, T, width = qkv.shape
    q, k, v = qkv.reshape(B, T, 3, num_heads, width // (3 * num_heads)).permute(2, 0, 3, 1, 4)
    out = TF.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale)
    return out.transpose(1, 2).reshape(B, T, -1)


def _normalized_shape(x, normalized_ndim):
    return x.shape[x.ndim - normalized_ndim:]


OP_TWINS = {
    "MatMul": lambda a, b: a @ b,
    "LinearOp": lambda x, weight, bias=None: TF.linear(x, weight, bias),
    "Softmax": lambda x, axis=-1: torch.softmax(x, dim=axis),
    "LogSoftmax": lambda x, axis=-1: torch.log_softmax(x, dim=axis),
    "ScaledDotProductAttention": _sdpa,
    "PackedSelfAttention": _packed_self_attention,
    "LayerNormOp": lambda x, weight, bias, normalized_ndim=1, eps=1e-5: TF.layer_norm(
        x, _normalized_shape(x, normalized_ndim), weight, bias, eps),
    "RMSNormOp": lambda x, weight, normalized_ndim=1, eps=1e-6: TF.rms_norm(
        x, _normalized_shape(x, normalized_ndim), weight, eps),
    "CrossEntropy": lambda logits, target=None, ignore_index=-100, label_smoothing=0.0, reduction="mean":
        TF.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                         reduction=reduction),
    "DropoutOp": lambda x, p=0.5: TF.dropout(x, p),
    "Relu": torch.relu,
    "Gelu": lambda x, approximate="none": TF.gelu(x, approximate=approximate),
    "Silu": TF.silu,
    "Erfc": torch.special.erfc,
    "GetItem": lambda x, index: x[index],
    "RotaryOp": lambda x, cos, sin: LLAMA_TWINS.llama_apply_rotary_emb(x, cos, sin),  # llama2.c's, in torch
}

def _repeat_kv(ts):
    q, k, v, *rest = ts
    groups = q.shape[-3] // k.shape[-3]
    return [q, k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3), *rest]


# How a row's arrays reach the op (cases.Row.prep), through torch's ops.
PREP = {None: lambda ts: ts, "transpose_b": lambda ts: [ts[0], ts[1].transpose(-1, -2), *ts[2:]],
        "repeat_kv": _repeat_kv}


def _kernel(key, mode, path):
    row = kernel_rows.Row(path)
    twin = OP_TWINS.get(row.op)
    if twin is None:
        raise C.Absent("no PyTorch twin")
    prep = PREP[row.meta["prep"]]
    ts = [torch.tensor(a, requires_grad=g) for a, g in zip(row.arrays, row.grads)]
    params = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in row.params.items()}
    grad = torch.from_numpy(row.grad)

    def fwd():
        with torch.no_grad():
            return twin(*prep(ts), **params)

    def fwd_bwd():
        for t in ts:
            t.grad = None
        twin(*prep(ts), **params).backward(grad)

    def check():
        out = fwd().numpy()
        if mode == "fwd":
            return kernel_rows.check(row, out)
        fwd_bwd()
        return kernel_rows.check(row, out, [None if t.grad is None else t.grad.numpy() for t in ts])
    return C.Built(fwd if mode == "fwd" else fwd_bwd, check)


def _optimizer(key, inputs):
    _, cls, kwargs = C.OPTIMIZERS[key]
    n = len(C.OPTIM_SHAPES)
    params = [torch.tensor(inputs[f"p{i}"], requires_grad=True) for i in range(n)]
    for i, p in enumerate(params):
        p.grad = torch.tensor(inputs[f"g{i}"])
    opt = getattr(torch.optim, cls)(params, **kwargs)

    def check():
        for _ in range(C.CHECK_STEPS):
            opt.step()
        return {f"p{i}": p.detach().numpy().copy() for i, p in enumerate(params)}
    return C.Built(opt.step, check)


BLAS_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot")
PHASES = ("zero_grad", "forward", "backward", "clip", "optimizer")


def profile(built, steps):
    """The same step under torch.profiler (CPU): time per phase, in BLAS
    (self time of the matrix-product ops), the op counts, and the profiler's
    own table of key_averages (grouped by op name), top 15 by self CPU time."""
    from torch.profiler import ProfilerActivity, record_function
    train = built.train
    for _ in range(2):
        train()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train()
        times.append(time.perf_counter() - start)
    profiled = []
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            with record_function("zero_grad"):
                train.zero_grad()
            with record_function("forward"):
                loss = train.loss_fn()
            with record_function("backward"):
                loss.backward()
            if train.clip is not None:
                with record_function("clip"):
                    train.clip(train.params, C.CLIP_NORM)
            with record_function("optimizer"):
                train.update()
            profiled.append(time.perf_counter() - start)
    averages = prof.key_averages()
    per_step = lambda us: us / steps / 1e3  # profiler times are in microseconds
    by_key = {e.key: e for e in averages}
    events = prof.events()
    # ops called from Python during forward: aten ops whose parent is the "forward" range
    forward_ops = sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is not None
                      and e.cpu_parent.name == "forward") / steps
    backward_nodes = sum(1 for e in events if e.name.startswith("autograd::engine::evaluate_function:")) / steps
    return {
        "plain_ms": statistics.median(times) * 1e3, "instrumented_ms": statistics.median(profiled) * 1e3,
        "phases_ms": {p: per_step(by_key[p].cpu_time_total) for p in PHASES if p in by_key},
        "blas_ms": per_step(sum(by_key[k].self_cpu_time_total for k in BLAS_OPS if k in by_key)),
        "forward_ops_per_step": forward_ops, "backward_nodes_per_step": backward_nodes,
        "aten_calls_per_step": sum(e.count for e in averages if e.key.startswith("aten::")) / steps,
        "table": averages.table(sort_by="self_cpu_time_total", row_limit=15),
    }


# ------------------------------------------------------------ Llama
# The twin of llama2.c's model.py in examples/torch_models.py (its module names, so our state dict loads).

def _llama_twins():
    import importlib
    import os
    import sys
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    return importlib.import_module("torch_models")


LLAMA_TWINS = _llama_twins()


def _llama(inputs, weights, buffers):
    c = C.LLAMA
    model = LLAMA_TWINS.Llama(dim=c["dim"], n_layers=c["n_layers"], n_heads=c["n_heads"], n_kv_heads=c["n_kv_heads"],
                        vocab_size=c["vocab_size"], multiple_of=c["multiple_of"], max_seq_len=c["max_seq_len"])
    model.load_state_dict(_state(weights))
    idx, target = torch.from_numpy(inputs["idx"]), torch.from_numpy(inputs["target"]).reshape(-1)
    forward = lambda: model(idx)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=c["lr"], weight_decay=c["weight_decay"])
    train = C.TrainStep(_lm_loss(forward, target), opt, clip=torch.nn.utils.clip_grad_norm_, params=params)
    return C.Built(train, _train_check(train, forward), train)


_WORKLOAD_BUILDERS["llama"] = _llama

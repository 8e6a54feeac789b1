"""What the benchmark measures: every case's name, row label and sizes,
shared by the parent (run.py, profile.py) and the workers (worker.py).

A case is one timed unit of work. Its id names it in the worker protocol
and names its shared input file (`files_of`):

    W1, W2, W3, copy   a training step of a workload (WORKLOADS)
    enc:0.0, enc:0.1   forward+backward of one encoder layer, dropout 0 / 0.1
    kernel:KEY:fwd     an op's forward, no graph: KEY is a row of KERNELS, or
                       OP@SIZE, the op's example(float32, SIZE) (example_row)
    kernel:KEY:fwdbwd  its forward and the backward of a fixed random gradient
    optim:KEY          one optimizer step on fixed gradients (OPTIMIZERS)
    alt:KEY            a kernel, a BLAS matmul, both in turn (ours only)

The tinygrad_attn worker writes a case's inputs and initial weights to
`<dir>/<file>.npz` (its `init` request); every framework's worker builds
the case from that file, so all of them start from the same numbers.

This module imports only the standard library, so the parent stays free of
any framework's thread pools.
"""
from collections import namedtuple

# ------------------------------------------------------------ the workloads
# Every layer argument is passed by keyword in the builders (impl_*.py):
# our defaults are moving to PyTorch's (batch_first=False, ffn 2048, dropout 0.1).

W1 = dict(vocab=64, d_model=128, nhead=4, ffn=512, layers=2, batch=32, seq=64, lr=1e-3)
W2 = dict(vocab=65, block=64, n_layer=4, n_head=4, n_embd=128, batch=12, lr=1e-3, weight_decay=0.1)
W3 = dict(embed_dim=128, num_heads=4, batch=32, seq=64)
COPY = dict(num_symbols=10, length=10, d_model=64, nhead=4, layers=2, ffn=256, batch=64, lr=1e-3,
            weight_decay=0.01)
CLIP_NORM = 1.0  # W2 and copy clip the global gradient norm as the trainer does; W1 does not
# Llama (llama2.c's architecture): nanoGPT's CPU size with 2 of the 4 heads' keys and
# values shared; SwiGLU width 352 (llama2.c's rule, multiple_of 32); a char vocabulary;
# AdamW and clipping as W2.
LLAMA = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=65, multiple_of=32, max_seq_len=64,
             batch=12, lr=1e-3, weight_decay=0.1)

WORKLOADS = {  # id: row label
    "W1": "W1 encoder LM, 2 post-norm layers d128, Adam, 32x64",
    "W2": "W2 char-GPT, 4 pre-norm blocks d128, AdamW, clip, 12x64",
    "W3": "W3 MultiheadAttention(128, 4) fwd+bwd, 32x64",
    "copy": "copy Seq2Seq, 2+2 layers d64, AdamW, clip, 64x10",
    "llama": "Llama char-LM, 4 blocks d128, 4 heads / 2 kv, AdamW, clip, 12x64",
}

ENCODER = dict(d_model=128, nhead=4, ffn=512, batch=32, seq=64)
ENCODER_CASES = ("enc:0.0", "enc:0.1")  # the dropout probability follows the colon

# ------------------------------------------------------------ the kernels
# A kernel row is an op of Function.registry applied to some (arrays, params),
# the same rows in every framework: ours calls Op.apply, numpy the op's numpy
# twin (the functions its docstring names in tinygrad_attn/reference/numpy_backward.py),
# PyTorch the op's twin in impl_torch.OP_TWINS when it has one. Every op that
# declares an `example` (the ops that run a kernel) gets a row by itself, from
# its example(float32, KERNEL_SIZE): our worker lists them (impl_ours.kernel_cases),
# so nothing here names them. KERNELS below are rows of the same kind whose
# inputs are given by hand, at the shapes people read: the issue's, a small
# Transformer's, the Llama's.
KERNEL_SIZE = 2 ** 20  # elements in the main input of the rows built from examples (run.py --kernel-size)


class Draw(namedtuple("Draw", "kind shape scale grad")):
    """An input our worker draws: kind "f", standard normal float32 times
    `scale`, requiring grad if `grad`; kind "i", integers in [0, scale)."""


def normal(*shape, scale=1.0, grad=True):
    return Draw("f", shape, scale, grad)


def integers(*shape, high):
    return Draw("i", shape, high, False)


class Row(namedtuple("Row", "op label shape inputs params prep")):
    """A kernel row given by hand: the op (its class name in Function.registry)
    applied to `inputs` (Draws, the op's arrays) with `params` (its keyword
    parameters; a Draw there is drawn too; the op's defaults fill the rest).
    `prep` says how the drawn arrays reach the op, through each framework's
    own ops (so their backward is timed too): None, as drawn; "transpose_b",
    the second one with its last two axes swapped (a view, K^T in Q K^T);
    "repeat_kv", the second and third (key and value) with each head
    repeated for the query heads that share it (grouped-query attention
    through a copy, beside the kernel's enable_gqa, which reads them in place)."""


def row(op, label, shape, inputs, prep=None, **params):
    return Row(op, label, shape, inputs, params, prep)


_B, _T, _D, _H, _FF, _V = 32, 64, 128, 4, 512, 1024
_E = _D // _H
_LB, _LT, _LD, _LH = LLAMA["batch"], LLAMA["max_seq_len"], LLAMA["dim"], LLAMA["n_heads"]
_QKV = [normal(_B, _H, _T, _E)] * 3
_GQA, _GQA_SHAPE = [normal(_B, _H, _T, _E)] + [normal(_B, _H // 2, _T, _E)] * 2, f"({_B},{_H}/{_H // 2},{_T},{_E})"
KERNELS = {
    "bmm_issue": row("MatMul", "matmul (batched)", "(32,8,64,64)@same", [normal(32, 8, 64, 64)] * 2),
    "softmax_issue": row("Softmax", "softmax", "(64,8,128,128)", [normal(64, 8, 128, 128, scale=3.0)], axis=-1),
    "linear": row("LinearOp", "linear (in-proj)", f"({_B},{_T},{_D})->{3 * _D}",
                  [normal(_B, _T, _D), normal(3 * _D, _D, scale=0.1), normal(3 * _D)]),
    "qk": row("MatMul", "matmul (Q K^T)", f"({_B},{_H},{_T},{_E})", [normal(_B, _H, _T, _E)] * 2, prep="transpose_b"),
    "softmax": row("Softmax", "softmax", f"({_B},{_H},{_T},{_T})", [normal(_B, _H, _T, _T, scale=3.0)], axis=-1),
    "attention": row("ScaledDotProductAttention", "attention", f"({_B},{_H},{_T},{_E})", _QKV),
    "attention_causal": row("ScaledDotProductAttention", "attention causal", f"({_B},{_H},{_T},{_E})", _QKV,
                            is_causal=True),
    "attention_gqa": row("ScaledDotProductAttention", "attention causal, 2 kv heads", _GQA_SHAPE, _GQA,
                         is_causal=True, enable_gqa=True),
    "attention_gqa_repeat": row("ScaledDotProductAttention", "attention causal, 2 kv heads, repeated", _GQA_SHAPE,
                                _GQA, prep="repeat_kv", is_causal=True),
    "layer_norm": row("LayerNormOp", "layer_norm", f"({_B},{_T},{_D})", [normal(_B, _T, _D), normal(_D), normal(_D)],
                      normalized_ndim=1, eps=1e-5),
    "cross_entropy": row("CrossEntropy", "cross_entropy", f"({_B * _T},{_V})", [normal(_B * _T, _V)],
                         target=integers(_B * _T, high=_V)),
    "dropout": row("DropoutOp", "dropout p=0.1", f"({_B},{_T},{_FF})", [normal(_B, _T, _FF)], p=0.1),
    "silu": row("Silu", "silu", f"({_B},{_T},{_FF})", [normal(_B, _T, _FF, scale=2.0)]),
    # a Llama step's kernels at its shapes (the llama table): PyTorch's F.rms_norm, llama2.c's rotary in torch
    "rms_norm": row("RMSNormOp", "rms_norm", f"({_LB},{_LT},{_LD})", [normal(_LB, _LT, _LD), normal(_LD)],
                    normalized_ndim=1, eps=1e-5),
    "rotary": row("RotaryOp", "rotary (queries)", f"({_LB},{_LT},{_LH},{_LD // _LH})",
                  [normal(_LB, _LT, _LH, _LD // _LH)] + [normal(_LT, _LD // _LH // 2, grad=False)] * 2),
}
KERNEL_GROUPS = (("Kernels at the issue's shapes", ("bmm_issue", "softmax_issue")),
                 (f"Kernels at Transformer shapes (B={_B}, T={_T}, d={_D}, {_H} heads, ffn {_FF})",
                  ("linear", "qk", "softmax", "attention", "attention_causal", "attention_gqa",
                   "attention_gqa_repeat", "layer_norm", "cross_entropy", "dropout", "silu")))
LLAMA_ROWS = ("rms_norm", "rotary")  # the llama table's, next to its training step


def example_row(op, size):
    """The key of the row of `op` (a class name) built from its example(float32, size)."""
    return f"{op}@{size}"


def example_of(key):
    """(op, size) of a row built from an example; None for a row of KERNELS."""
    op, at, size = key.partition("@")
    return (op, int(size)) if at else None


class Absent(Exception):
    """Raised by a worker's build when its framework has no version of a case
    (an op with no PyTorch twin, or whose numpy twin cannot be called): the
    row is timed without it, and says why."""


# ------------------------------------------------------------ optimizers
# The parameter shapes of W2's GPT (nanoGPT's CPU configuration).
_LAYER = [(128,), (128,), (384, 128), (384,), (128, 128), (128,), (128,), (128,), (512, 128), (512,),
          (128, 512), (128,)]
OPTIM_SHAPES = [(65, 128), (64, 128)] + _LAYER * 4 + [(128,), (128,)]
OPTIMIZERS = {  # KEY: (row label, class name, keyword arguments), the same in both frameworks
    "sgd": ("SGD momentum 0.9", "SGD", dict(lr=1e-3, momentum=0.9)),
    "adam": ("Adam", "Adam", dict(lr=1e-3)),
    "adamw": ("AdamW", "AdamW", dict(lr=1e-3)),
    "adamw_amsgrad": ("AdamW amsgrad", "AdamW", dict(lr=1e-3, amsgrad=True)),
}

# ------------------------------------------------------------ ours alone
ALTERNATING = dict(rows=4096, n=256)  # large enough that LayerNorm runs on every kernel thread
ALT_CASES = ("alt:ln", "alt:np", "alt:mm", "alt:ln+mm", "alt:np+mm")

# How many steps of a training workload the check runs before comparing losses.
CHECK_STEPS = 3
# Relative agreement asked of the frameworks: outputs and gradients (float32,
# summed in different orders), and losses after CHECK_STEPS steps.
ARRAY_RTOL = 1e-5
LOSS_RTOL = 1e-5


def kernel_case(key, mode):
    return f"kernel:{key}:{mode}"


def files_of(case):
    """The name of the shared input file of a case (fwd and fwd+bwd of a kernel share one)."""
    kind, _, rest = case.partition(":")
    if kind == "kernel":
        return "kernel-" + rest.split(":")[0]
    if kind in ("enc", "alt"):
        return kind
    return case.replace(":", "-")


class TrainStep:
    """One training step, the same code for both frameworks (their APIs agree):
    zero the gradients, forward and loss, backward, clip (if `clip`), update.

    `zero_grad` and `update` default to the optimizer's; W3 has no optimizer
    and passes its own zero_grad. Each phase is an attribute, so profile.py
    can time them one by one.
    """

    def __init__(self, loss_fn, optimizer=None, zero_grad=None, clip=None, params=None):
        self.loss_fn, self.optimizer, self.clip, self.params = loss_fn, optimizer, clip, params
        self.zero_grad = zero_grad or optimizer.zero_grad
        self.update = optimizer.step if optimizer is not None else (lambda: None)

    def __call__(self):
        self.zero_grad()
        loss = self.loss_fn()
        loss.backward()
        if self.clip is not None:
            self.clip(self.params, CLIP_NORM)
        self.update()
        return loss


class Built:
    """A case built in one framework: `step()` is the timed unit; `check()`
    returns what is compared across frameworks (name -> array, or a bool
    that must be True for names ending in "?"); `train` is the TrainStep of a
    training workload (profile.py times its phases)."""

    def __init__(self, step, check, train=None):
        self.step, self.check, self.train = step, check, train

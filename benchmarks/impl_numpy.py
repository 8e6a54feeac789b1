"""The kernel cases in plain numpy (baselines.py), run in a worker of their
own like the other frameworks, on the files impl_ours.init wrote."""
import numpy as np

import baselines as base
import cases as C

NAME = "numpy"


def set_threads(n):
    pass  # BLAS reads OPENBLAS_NUM_THREADS, which worker.py sets before numpy loads


def info():
    return {"name": NAME, "versions": f"numpy {np.__version__}", "blas": base.numpy_blas(), "threads": "-"}


FACTORIES = {  # KEY: inputs -> (forward, forward+backward)
    "bmm_issue": lambda a, b: base.np_matmul(a, b),
    "softmax_issue": base.np_softmax,
    "linear": base.np_linear,
    "qk": lambda q, k: base.np_matmul(q, np.swapaxes(k, -1, -2)),
    "softmax": base.np_softmax,
    "attention": lambda q, k, v: base.np_attention(q, k, v, False),
    "attention_causal": lambda q, k, v: base.np_attention(q, k, v, True),
    "layer_norm": base.np_layer_norm,
    "cross_entropy": base.np_cross_entropy,
    "dropout": lambda x: base.np_dropout(x, C.DROPOUT_P, np.random.default_rng(0)),
    "attention_gqa": lambda q, k, v: base.np_attention(q, np.repeat(k, 2, -3), np.repeat(v, 2, -3), True),
    "silu": base.np_silu,
}


def build(case, path):
    kind, _, rest = case.partition(":")
    if kind != "kernel":
        raise KeyError(f"case {case!r} has no numpy version")
    key, mode = rest.split(":")
    with np.load(path) as f:
        arrays = [f[f"in.{i}"] for i in range(len(C.KERNELS[key][2]))]
    fwd, fwd_bwd = FACTORIES[key](*arrays)

    def check():  # the forward only: the hand-written backwards start from other gradients
        out = fwd()
        if key == "dropout":
            return {"dropout?": base.dropout_ok(arrays[0], out, C.DROPOUT_P)}
        if key == "linear":  # baselines' linear works on the rows (B*T, d)
            out = out.reshape(arrays[0].shape[:-1] + (-1,))
        return {"out": out}
    return C.Built(fwd if mode == "fwd" else fwd_bwd, check)

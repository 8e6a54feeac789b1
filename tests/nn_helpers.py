"""Helpers for the nn tests: gradcheck of a whole module, the ops in a graph, numpy references
written from the formulas of the seed notes (the lecture notes this project's
math comes from; README.md, "Learn"): a loop over heads, each with its own
W_Q^i, W_K^i, W_V^i; and a hypothesis strategy for attention set-ups."""
from typing import NamedTuple, Optional

import numpy as np
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn.reference import numpy_backward as nb


def module_gradcheck(module, inputs, forward=None, **gradcheck_kwargs):
    """Finite-difference check of `forward(module, *inputs)` (default
    `module(*inputs)`) in float64, with respect to the inputs that require
    grad AND every parameter of the module.

    gradcheck perturbs float64 copies of what it is given, so each parameter
    is swapped for its copy on the owning module while `fn` runs.
    """
    module.double()
    named = list(module.named_parameters())
    slots = []
    for name, _ in named:
        owner_path, _, attr = name.rpartition(".")
        slots.append((module.get_submodule(owner_path), attr))
    forward = forward or (lambda m, *xs: m(*xs))
    n_inputs = len(inputs)

    def fn(*args):
        for (owner, attr), value in zip(slots, args[n_inputs:]):
            setattr(owner, attr, value)
        return forward(module, *args[:n_inputs])

    params = [tg.Tensor(p.data.copy(), requires_grad=True) for _, p in named]
    try:
        return tg.gradcheck(fn, tuple(inputs) + tuple(params), **gradcheck_kwargs)
    finally:
        for (owner, attr), (_, p) in zip(slots, named):
            setattr(owner, attr, p)


# ------------------------------------------------------------ numpy references

def additive_mask_ref(key_padding_mask, attn_mask, is_causal, B, H, L, S):
    """The masks as one float array (B, H, L, S) to add to the scores,
    following torch.nn.MultiheadAttention (boolean True = blocked)."""
    add = np.zeros((B, H, L, S))
    if attn_mask is not None:
        m = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == bool else attn_mask
        add = add + (m.reshape(B, H, L, S) if m.ndim == 3 else m)
    elif is_causal:
        add = add + np.triu(np.full((L, S), -np.inf), k=1)
    if key_padding_mask is not None:
        m = key_padding_mask
        m = np.where(m, -np.inf, 0.0) if m.dtype == bool else m
        add = add + m[:, None, None, :]
    return add


def mha_reference(mha, query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False):
    """Multi-head attention the seeds' way, in float64 numpy. Returns the
    output, the per-head weights (B, H, L, S) and the concatenated heads."""
    batched = query.ndim == 3
    if not batched:
        query, key, value = query[None], key[None], value[None]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
    elif not mha.batch_first:
        query, key, value = (np.swapaxes(a, 0, 1) for a in (query, key, value))
    B, L, S = query.shape[0], query.shape[1], key.shape[1]
    H, hd = mha.num_heads, mha.head_dim
    add = additive_mask_ref(key_padding_mask, attn_mask, is_causal, B, H, L, S)
    d = H * hd
    if mha.in_proj_weight is not None:
        w = mha.in_proj_weight.data.astype(np.float64)
        w_q, w_k, w_v = w[:d], w[d:2 * d], w[2 * d:]
    else:
        w_q, w_k, w_v = (p.data.astype(np.float64) for p in (mha.q_proj_weight, mha.k_proj_weight,
                                                              mha.v_proj_weight))
    b = np.zeros(3 * d) if mha.in_proj_bias is None else mha.in_proj_bias.data.astype(np.float64)
    w_o = mha.out_proj.weight.data.astype(np.float64).T  # (H * hd, E)
    b_o = 0 if mha.out_proj.bias is None else mha.out_proj.bias.data.astype(np.float64)
    outs, weights, concats = [], np.zeros((B, H, L, S)), []
    for n in range(B):
        heads = []
        for i in range(H):
            rows = slice(i * hd, (i + 1) * hd)
            q = query[n] @ w_q[rows].T + b[:d][rows]          # q = x W_Q^i
            k = key[n] @ w_k[rows].T + b[d:2 * d][rows]
            v = value[n] @ w_v[rows].T + b[2 * d:][rows]
            a = nb.softmax_forward(q @ k.T / np.sqrt(hd) + add[n, i])
            weights[n, i] = a
            heads.append(a @ v)                               # Z_i: (L, hd)
        concat = np.concatenate(heads, axis=1)                # (L, H * hd)
        concats.append(concat)
        outs.append(concat @ w_o + b_o)
    out, concat = np.stack(outs), np.stack(concats)
    if not batched:
        return out[0], weights[0], concat[0]
    if not mha.batch_first:
        out = np.swapaxes(out, 0, 1)
    return out, weights, concat


# ---------------------------------------------------------- attention set-ups

class AttentionCase(NamedTuple):
    kwargs: dict                   # MultiHeadAttention constructor arguments
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    self_attention: bool           # pass the same tensor as query, key and value
    key_padding_mask: Optional[np.ndarray]
    attn_mask: Optional[np.ndarray]
    is_causal: bool
    need_weights: bool
    average_attn_weights: bool


@st.composite
def attention_cases(draw, torch_compatible=False, max_side=3):
    """A MultiHeadAttention configuration with inputs and masks.

    Masks never block key 0, so no query is left without a key (which would
    give NaN, in PyTorch as here). is_causal comes with its attn_mask (the
    hint needs it, as in PyTorch). With torch_compatible, head_dim is
    embed_dim // num_heads.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    H = draw(st.integers(1, 2))
    hd = draw(st.integers(1, 2))
    E = H * hd if torch_compatible or draw(st.booleans()) else draw(st.integers(1, 4))
    head_dim = None if E == H * hd else hd
    self_attention = draw(st.booleans())
    kdim = vdim = None
    if not self_attention and draw(st.booleans()):
        kdim, vdim = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    batched = draw(st.booleans())
    batch_first = draw(st.booleans())
    B = draw(st.integers(1, 2)) if batched else 1
    L = draw(st.integers(1, max_side))
    S = L if self_attention else draw(st.integers(1, max_side))

    def seq(T, dim):
        shape = ((B, T, dim) if batch_first else (T, B, dim)) if batched else (T, dim)
        return rng.normal(size=shape)

    query = seq(L, E)
    key = query if self_attention else seq(S, kdim or E)
    value = query if self_attention else seq(S, vdim or E)

    def blocking(shape, kind):
        if kind == "bool":
            m = rng.random(shape) < 0.4
            m[..., 0] = False
        else:
            m = rng.uniform(-2, 0.5, size=shape)
            m[..., 1:][rng.random(m[..., 1:].shape) < 0.3] = -np.inf
        return m

    kpm_kind = draw(st.sampled_from([None, "bool", "float"]))
    kpm = None if kpm_kind is None else blocking((B, S) if batched else (S,), kpm_kind)
    mask_kind = draw(st.sampled_from([None, "bool", "float", "causal"]))
    is_causal = mask_kind == "causal"
    attn_mask = None
    if mask_kind in ("bool", "float"):
        shape = draw(st.sampled_from([(L, S), (B * H, L, S)]))
        attn_mask = blocking(shape, mask_kind)
    elif is_causal:
        attn_mask = np.triu(np.ones((L, S), dtype=bool), k=1)
    if torch_compatible and kpm is not None and attn_mask is not None and kpm.dtype != attn_mask.dtype:
        # PyTorch deprecates mixing mask types: give both the same one.
        kpm = blocking(kpm.shape, "bool" if attn_mask.dtype == bool else "float")
    need_weights = draw(st.booleans())
    kwargs = dict(embed_dim=E, num_heads=H, bias=draw(st.booleans()), batch_first=batch_first,
                  kdim=kdim, vdim=vdim)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    return AttentionCase(kwargs, query, key, value, self_attention, kpm, attn_mask, is_causal,
                         need_weights, draw(st.booleans()))


def normal(*shape, seed=0):
    """Standard normal float64 samples from a fixed seed."""
    return np.random.default_rng(seed).normal(size=shape)


def padding(B, S):
    """Key padding (B, S), True = padding: the last two keys of the first sequence."""
    m = np.zeros((B, S), dtype=bool)
    m[0, -2:] = True
    return m


def ops_in_graph(out):
    """Names of the ops that made `out`, walking its graph."""
    seen, stack, names = set(), [out], set()
    while stack:
        t = stack.pop()
        if id(t) in seen or t._ctx is None:
            continue
        seen.add(id(t))
        names.add(t._ctx.fn.__name__)
        stack.extend(t._ctx.parents)
    return names

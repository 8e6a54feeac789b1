"""Rotary position embedding: rotate each pair (2i, 2i+1) of a head vector
by the angle of its position, forward and backward.

x holds rows of H heads of hd features, (rows, H, hd), row r at position
t = r % T; cos and sin are (T, hd/2): cos(t * f_i), sin(t * f_i). For each
pair (a, b) = (x[2i], x[2i+1]):

    out[2i]   = a cos - b sin
    out[2i+1] = a sin + b cos

a rotation by t * f_i, orthogonal: its transpose, the rotation by -t * f_i,
is its inverse. So the backward is the same loop with sin negated
(`sign` = -1): dL/dx = R^T dL/dout rotates the gradient back.

Each (row, head, pair) is computed on its own: no sums, nothing to regroup.
"""

from .registry import kernel
from .threads import parallel_for


@kernel
def _rotary(x, cos, sin, sign, out, start, stop):
    """out = x rotated pairwise by the angles of each row's position, sin scaled
    by `sign` (1: forward, -1: the inverse rotation), for rows [start, stop)."""
    T, half = cos.shape
    H = x.shape[1]
    for r in range(start, stop):
        t = r % T
        c, s = cos[t], sin[t]
        for h in range(H):
            xr, yr = x[r, h], out[r, h]
            for i in range(half):
                a, b = xr[2 * i], xr[2 * i + 1]
                si = sign * s[i]
                yr[2 * i] = a * c[i] - b * si
                yr[2 * i + 1] = a * si + b * c[i]


def rotary_forward(x, cos, sin, out):
    """out = x rotated by the angles of its positions; x, out: (rows, H, hd), row r at
    position r % T; cos, sin: (T, hd/2), C-contiguous, in x's dtype."""
    parallel_for(_rotary, x.shape[0], x, cos, sin, x.dtype.type(1), out, item_size=x.shape[1] * x.shape[2])


def rotary_backward(grad, cos, sin, dx):
    """dx = the gradient rotated back (by minus the angles): the transpose of the rotation."""
    parallel_for(_rotary, grad.shape[0], grad, cos, sin, grad.dtype.type(-1), dx,
                 item_size=grad.shape[1] * grad.shape[2])

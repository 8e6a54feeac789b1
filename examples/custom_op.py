"""Add a new op to tinygrad_attn and prove its gradient with gradcheck.

The op: Softplus, y = log(1 + e^x), whose derivative is the sigmoid,
dy/dx = 1 / (1 + e^-x).

    python examples/custom_op.py
"""
import numpy as np

import tinygrad_attn as tg


class Softplus(tg.Function):
    """y = log(1 + e^x).   dy/dx = sigmoid(x) = 1 / (1 + e^-x)."""

    @staticmethod
    def forward(ctx, x, beta=1.0):
        # log(1 + e^(beta x)) / beta, written so large inputs do not overflow.
        bx = beta * x
        y = (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / beta
        ctx.save_for_backward(bx)
        return y.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad_output):
        bx, = ctx.saved_tensors
        sigmoid = 0.5 * (1 + np.tanh(0.5 * bx))
        return grad_output * sigmoid


def softplus(x, beta=1.0):
    return Softplus.apply(x, beta=beta)


def main():
    x = tg.Tensor(np.linspace(-3, 3, 7), dtype="float64", requires_grad=True)
    y = softplus(x, beta=2.0)
    y.sum().backward()
    print("x        ", np.round(x.data, 3))
    print("softplus ", np.round(y.data, 4))
    print("gradient ", np.round(x.grad.data, 4))

    # The proof: analytic Jacobian == central differences, element by element.
    print("gradcheck:", tg.gradcheck(lambda t: softplus(t, beta=2.0), x))

    # And gradcheck catches a wrong backward:
    class BadSoftplus(Softplus):
        @staticmethod
        def backward(ctx, grad_output):
            bx, = ctx.saved_tensors
            return grad_output * np.exp(bx)  # wrong derivative

    ok = tg.gradcheck(lambda t: BadSoftplus.apply(t, beta=2.0), x, raise_exception=False)
    print("gradcheck of a wrong backward:", ok)
    return ok


if __name__ == "__main__":
    main()

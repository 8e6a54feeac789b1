"""Train a two-layer network on a toy regression task with nothing but
Tensor ops and a hand-written SGD step, printing the loss as it falls.

    python examples/quickstart.py
"""
import numpy as np

import tinygrad_attn as tg


def main(steps=300, lr=0.05, seed=0):
    tg.manual_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(256, 1)).astype(np.float32)
    y = np.sin(x)  # the function to learn
    X, Y = tg.Tensor(x), tg.Tensor(y)

    hidden = 32
    w1 = (tg.randn(1, hidden) * 1.0).requires_grad_()
    b1 = tg.zeros(hidden, requires_grad=True)
    w2 = (tg.randn(hidden, 1) * (1 / hidden ** 0.5)).requires_grad_()
    b2 = tg.zeros(1, requires_grad=True)
    params = [w1, b1, w2, b2]

    for step in range(steps + 1):
        pred = (X @ w1 + b1).tanh() @ w2 + b2
        loss = ((pred - Y) ** 2).mean()
        for p in params:
            p.grad = None
        loss.backward()
        with tg.no_grad():
            for p in params:
                p.data -= lr * p.grad.data
        if step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.5f}")
    return loss.item()


if __name__ == "__main__":
    main()

"""The framework's random number generator.

Parameter initialisation, dropout masks and data sampling all draw from one
numpy Generator, so `manual_seed(n)` makes a whole run reproducible.
"""
import numpy as np

_generator = np.random.default_rng()


def manual_seed(seed):
    """Reseed the global generator (like torch.manual_seed) and return it."""
    global _generator
    _generator = np.random.default_rng(seed)
    return _generator


def get_generator():
    """The global numpy Generator that every random draw in the framework uses."""
    return _generator

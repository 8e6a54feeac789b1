"""`Optimizer`: what SGD, Adam and AdamW share.

The layout is torch.optim's, so code and habits carry over:

- `param_groups` is a list of dicts, each holding `params` (a list of
  tensors) and that group's hyper-parameters; a group that leaves one out
  gets the optimizer's default. Typical use: no weight decay on biases and
  LayerNorm weights.
- `state[p]` is a dict of per-parameter state (a momentum buffer, Adam's
  moments, a step count): numpy arrays of the parameter's shape and dtype,
  and Python scalars.
- `step()` reads `p.grad` and updates `p.data` in place; parameters whose
  `.grad` is None are skipped (they took no part in the loss).
- `state_dict()` names parameters by their index in the order of
  `param_groups` (as torch does), so it can be loaded into a fresh optimizer
  built over the same parameters, and training resumes exactly.

Subclasses define `_check_group(group)` (validate hyper-parameters),
`_state_keys(group)` (which state a parameter carries) and
`_update(p, grad, state, group)` (one parameter's update).
"""
import copy
import numbers

import numpy as np

from ..autograd import enable_grad, no_grad
from ..shapes import ShapeError
from ..tensor import Tensor


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()  # a default that every parameter group must set itself


def _implementation_options(name, capturable=False, differentiable=False):
    """torch.optim's keyword-only implementation options. foreach and fused
    pick how torch loops over the parameters (the update is the same), so
    they are accepted and change nothing; capturable (CUDA graphs) and
    differentiable (gradients through the step) are not implemented."""
    for arg, value in (("capturable", capturable), ("differentiable", differentiable)):
        if value:
            raise NotImplementedError(f"{name}: {arg}=True is not implemented")


class Optimizer:
    """Base class of the optimizers: param groups, zero_grad, step, state_dict.

    `params` is an iterable of Tensors, or of dicts that each hold `params`
    plus hyper-parameters overriding `defaults`:

        Adam([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=1e-3)
    """

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.state = {}  # keyed by the parameter tensor itself (hashed by identity)
        self.param_groups = []
        name = type(self).__name__
        if isinstance(params, Tensor):
            raise TypeError(f"{name}: params should be an iterable of Tensors or of dicts, "
                            f"got a single Tensor of shape {params.shape} (wrap it in a list)")
        if isinstance(params, dict):
            raise TypeError(f"{name}: params should be an iterable of Tensors or of dicts, "
                            "got one dict (wrap it in a list)")
        groups = list(params)
        if not groups:
            raise ValueError(f"{name}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines) + "\n)"

    # --------------------------------------------------------- param groups
    def add_param_group(self, param_group):
        """Add a group of parameters (a dict with `params` and optional
        hyper-parameters; missing ones are filled from the defaults)."""
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"{name}: a parameter group needs a 'params' entry")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError(f"{name}: parameters must be in an ordered collection (a list), "
                            "not a set: the order of a set changes between runs")
        group["params"] = list(params)
        if not group["params"]:
            raise ValueError(f"{name}: got a parameter group with no parameters")
        for i, p in enumerate(group["params"]):
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: can only optimize Tensors, but parameter {i} of the "
                                f"group is a {type(p).__name__}")
            if p.dtype.kind != "f":
                raise TypeError(f"{name}: can only optimize floating-point tensors, but parameter "
                                f"{i} of the group has dtype {p.dtype} (shape {p.shape})")
            if not p.is_leaf:
                raise ValueError(f"{name}: can't optimize a non-leaf tensor (parameter {i} of the "
                                 f"group, shape {p.shape}, made by {p.grad_fn}); use .detach()")

        for key, default in self.defaults.items():
            if default is required and key not in group:
                raise ValueError(f"{name}: parameter group didn't specify a value of required "
                                 f"hyper-parameter {key!r}")
            group.setdefault(key, default)
        self._check_group(group)

        seen = {id(p) for g in self.param_groups for p in g["params"]}
        new = [id(p) for p in group["params"]]
        if len(set(new)) != len(new):
            raise ValueError(f"{name}: a parameter group lists the same parameter twice")
        if seen.intersection(new):
            raise ValueError(f"{name}: some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    # ----------------------------------------------------------- the step
    def zero_grad(self, set_to_none=True):
        """Reset the gradients: to None (default, as torch), or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.data.fill(0)

    def step(self, closure=None):
        """Update every parameter that has a gradient, in place.

        `closure`, if given, re-evaluates the model and returns the loss
        (it runs with gradients enabled); its loss is returned.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    self._update(p, self._grad_array(p), self.state.setdefault(p, {}), group)
        return loss

    def _grad_array(self, p):
        """p.grad as an array of p's shape and dtype (never modified in place)."""
        g = p.grad.data if isinstance(p.grad, Tensor) else np.asarray(p.grad)
        if g.shape != p.shape:
            raise ShapeError(f"{type(self).__name__}.step: gradient of shape {g.shape} for a "
                             f"parameter of shape {p.shape}")
        return g if g.dtype == p.dtype else g.astype(p.dtype)

    # ---------------------------------------------------- subclass hooks
    def _check_group(self, group):
        """Raise ValueError for bad hyper-parameters in `group`."""

    def _state_keys(self, group):
        """The state a parameter of `group` carries once it has been updated."""
        return set()

    def _update(self, p, grad, state, group):
        raise NotImplementedError

    def _check_number(self, group, key, low=0.0):
        """A hyper-parameter must be a real number >= low."""
        value = group[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{type(self).__name__}: {key} must be a number, got {value!r}")
        if not value >= low:  # `not >=` also catches NaN
            raise ValueError(f"{type(self).__name__}: invalid {key} {value} (must be >= {low})")

    # --------------------------------------------------------- state dict
    def state_dict(self):
        """The optimizer's state as plain data, to save and load later.

        Returns {"state": {index: {name: ndarray or scalar}}, "param_groups":
        [{hyper-parameters..., "params": [index, ...]}]}, where a
        parameter's index is its position in the order of `param_groups`.
        Arrays are copies: later steps do not change a saved state_dict.
        `flatten_state_dict` turns it into arrays for a safetensors file.
        """
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {}
        for p, s in self.state.items():
            if s:
                state[index[id(p)]] = {k: v.copy() if isinstance(v, np.ndarray) else v
                                       for k, v in s.items()}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Load a state saved by `state_dict()` (of an optimizer over
        parameters of the same shapes, grouped the same way).

        Everything is checked before anything changes: a mismatched or
        corrupt state raises ValueError and leaves the optimizer as it was.
        Arrays are copied and cast to their parameter's dtype.
        """
        name = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError(f"{name}.load_state_dict: expected a dict with keys 'state' and "
                             f"'param_groups', got {type(state_dict).__name__}"
                             + (f" with keys {sorted(state_dict)}" if isinstance(state_dict, dict) else ""))
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}.load_state_dict: the state has {len(saved_groups)} parameter "
                             f"groups, the optimizer has {len(self.param_groups)}")
        params_by_index = {}
        new_groups = []
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if not isinstance(saved, dict) or "params" not in saved:
                raise ValueError(f"{name}.load_state_dict: parameter group {gi} of the state is "
                                 "not a dict with a 'params' entry")
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"{name}.load_state_dict: parameter group {gi} has "
                                 f"{len(saved['params'])} parameters in the state and "
                                 f"{len(group['params'])} in the optimizer")
            missing = set(self.defaults) - set(saved)
            if missing:
                raise ValueError(f"{name}.load_state_dict: parameter group {gi} of the state lacks "
                                 f"{sorted(missing)} (was it saved by another optimizer?)")
            for i, p in zip(saved["params"], group["params"]):
                params_by_index[int(i)] = (p, gi)
            new = copy.deepcopy({k: v for k, v in saved.items() if k != "params"})
            for k, v in new.items():  # tuples come back as lists from JSON
                if isinstance(group.get(k), tuple) and isinstance(v, list):
                    new[k] = tuple(v)
            new["params"] = group["params"]
            self._check_group(new)
            new_groups.append(new)

        new_state = {}
        for i, saved in state_dict["state"].items():
            i = int(i)
            if i not in params_by_index:
                raise ValueError(f"{name}.load_state_dict: the state has an entry for parameter "
                                 f"{i}, but the optimizer has {len(params_by_index)} parameters")
            p, gi = params_by_index[i]
            expected = self._state_keys(new_groups[gi])
            if set(saved) != expected:
                raise ValueError(f"{name}.load_state_dict: parameter {i} has state "
                                 f"{sorted(saved)}, expected {sorted(expected)}")
            entry = {}
            for k, v in saved.items():
                if isinstance(v, np.ndarray):
                    if v.shape != p.shape:
                        raise ValueError(f"{name}.load_state_dict: state {k!r} of parameter {i} "
                                         f"has shape {v.shape}, the parameter has shape {p.shape}")
                    v = v.astype(p.dtype, copy=True)
                entry[k] = v
            new_state[p] = entry

        for group, new in zip(self.param_groups, new_groups):
            group.clear()  # in place: a scheduler may hold these dicts
            group.update(new)
        self.state = new_state

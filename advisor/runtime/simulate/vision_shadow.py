"""Real values beside fake tensors for the small integer tensors a vision-language model reads in Python.

A vision-language forward steers its shapes by values: the image grid (``image_grid_thw``: how many patches,
which windows, the rotary positions), the placeholder tokens in ``input_ids`` (where the image features go,
Qwen's 3-D rotary index), the tiles of an image. A fake tensor has no values, so under ``FakeTensorMode`` these
reads fail (``nonzero``, ``repeat_interleave`` with tensor repeats, ``.tolist()``). ``ShadowValues`` keeps a real
copy ("shadow") of every integer or boolean tensor computed only from shadowed ones (the batch's ids, grids and
masks are given shadows when made): each such op runs on the shadows too, a data-dependent op's output gets the
shape its shadow has, and a scalar read answers the shadow's value. Floating-point tensors (the model's
activations and weights) never get shadows: their memory is the fake tensors', their values are never read.
"""

from __future__ import annotations

ATTR = "_advisor_shadow"
FACTORY_LIMIT = 1 << 20
"""Elements up to which a tensor made from shapes alone (``arange``, ``linspace``, ``zeros``) gets a shadow: index
metadata is that small; a buffer the size of the activations made so is never read in Python."""


def shadow_of(t):
    """The real values of fake tensor ``t`` (None when it has none)."""
    return getattr(t, ATTR, None)


def give_shadow(fake, real) -> None:
    setattr(fake, ATTR, real)


def _make_mode_class():
    import torch
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                                unset_fake_temporarily)
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    def fake_like(real):
        # a fake tensor of the real one's shape, dtype and strides, allocated as the op would allocate it
        return torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="cpu")

    LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)

    def _numel(out):
        return sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))

    Tensor = torch.Tensor

    def _tensors(args, kwargs):
        # the tensor arguments of an aten op: given directly or in a list (an aten schema nests no deeper);
        # pytree's flatten costs a fifth of a vision-language trace here
        flat = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, Tensor):
                flat.append(a)
            elif isinstance(a, (list, tuple)):
                flat.extend(x for x in a if isinstance(x, Tensor))
        return flat

    class ShadowValues(TorchDispatchMode):
        """Runs each op whose tensor inputs all carry shadows on the shadows too (see the module docstring)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = _tensors(args, kwargs)
            fakes = [a for a in flat if isinstance(a, FakeTensor)]
            shadowed = all(shadow_of(a) is not None for a in fakes) and (
                bool(fakes) or not flat or func in LIFTS)
            if func is torch.ops.aten._local_scalar_dense.default and shadowed:
                with unset_fake_temporarily():
                    return shadow_of(args[0]).item()
            if not shadowed:
                if func in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                            torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default):
                    args = self._long_indices(func, args)
                return func(*args, **kwargs)
            try:
                out, dynamic = func(*args, **kwargs), False
            except (DynamicOutputShapeException, DataDependentOutputException):
                out, dynamic = None, True
            if not dynamic and not fakes and func not in LIFTS and _numel(out) > FACTORY_LIMIT:
                return out  # a large buffer made from shapes alone (not index metadata): no shadow
            real_args, real_kwargs = tree_map(lambda a: shadow_of(a) if isinstance(a, FakeTensor) else a,
                                              (args, kwargs))
            with unset_fake_temporarily():
                real_out = func(*real_args, **real_kwargs) if func not in LIFTS else real_args[0].clone()
            if dynamic:
                out = tree_map(lambda r: fake_like(r) if isinstance(r, torch.Tensor) else r, real_out)
            for o, r in zip(tree_flatten(out)[0], tree_flatten(real_out)[0]):
                if isinstance(o, FakeTensor) and isinstance(r, torch.Tensor):
                    give_shadow(o, r)
            return out

        @staticmethod
        def _long_indices(func, args):
            """A boolean index with a shadow becomes the long indices of its true places (what the op does
            itself, with a shape the fake op could not know)."""
            indices = args[1]
            if not any(i is not None and i.dtype == torch.bool and shadow_of(i) is not None for i in indices):
                return args
            out = []
            for i in indices:
                if i is not None and i.dtype == torch.bool and shadow_of(i) is not None:
                    with unset_fake_temporarily():
                        real = shadow_of(i).nonzero(as_tuple=True)
                    for r in real:
                        f = fake_like(r)
                        give_shadow(f, r)
                        out.append(f)
                else:
                    out.append(i)
            return (args[0], out, *args[2:])

    from torch.overrides import TorchFunctionMode

    class ShadowData(TorchFunctionMode):
        """``torch.tensor([...])`` of tensors reads their data in C++, below the dispatcher: give it the shadows'
        values (Qwen3-VL's rope deltas are made so)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.tensor, torch.as_tensor) and args:
                def value(a):
                    if isinstance(a, FakeTensor) and shadow_of(a) is not None:
                        with unset_fake_temporarily():
                            return shadow_of(a).tolist()
                    return a
                args = (tree_map(value, args[0]), *args[1:])
            return func(*args, **kwargs)

    return ShadowValues, ShadowData


_CLS = None


def shadow_values():
    """A context with the ``ShadowValues`` dispatch mode (entered between the fake mode and the memory tracker) and
    the ``ShadowData`` function mode."""
    import contextlib

    global _CLS
    if _CLS is None:
        _CLS = _make_mode_class()
    values, data = _CLS
    stack = contextlib.ExitStack()
    stack.enter_context(data())
    stack.enter_context(values())
    return stack


def with_shadow(real):
    """A fake tensor made now (under the fake mode) of ``real``'s shape, carrying ``real`` as its shadow."""
    import torch

    fake = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="cpu")
    give_shadow(fake, real)
    return fake

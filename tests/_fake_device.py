"""A CPU stand-in for an accelerator: tensors that claim device ``fakegpu:0``, compute on the CPU, and refuse
to mix with CPU tensors exactly where CUDA refuses ("Expected all tensors to be on the same device").

Why: a forward that leaves one input on the CPU while the model sits on the accelerator (issue 36: the packed
forward's attention mask) runs fine on a CPU-only machine, where everything is on the CPU, and crashes on the
first GPU iteration. This module makes that crash reproducible on the CPU.

How: ``FakeDeviceTensor`` is a wrapper tensor subclass (``torch.Tensor._make_wrapper_subclass``) whose device
is PrivateUse1 renamed ``fakegpu`` (``torch.device("fakegpu")`` parses, ``tensor.device.type == "fakegpu"``,
``is_cpu`` is False; a Python device guard is registered because C++ code such as advanced indexing takes one)
and which holds an ordinary CPU tensor. Every aten op with a fake operand, or with ``device=fakegpu``
(factories, ``.to(fake)``), goes through ``_dispatch``: it checks the operands' devices with CUDA's rule,
unwraps, runs the real CPU kernel and wraps the results. Inside ``fake_device()`` (a ``TorchDispatchMode``,
plus a ``TorchFunctionMode`` for ``torch.tensor(data, device=...)``, which bypasses dispatch modes) plain CPU
tensors and factories are seen too, so ``torch.zeros(3, device="fakegpu")``, ``cpu_tensor.to("fakegpu")`` and
``model.to("fakegpu")`` work. Parameters become ``FakeDeviceTensor``s (still ``nn.Parameter`` to
``isinstance``), swapped in place, so tied weights stay tied; autograd runs above the wrapper, gradients land
on the device.

The device rule, as CUDA applies it:
  * all tensor operands on the same device; a 0-dim CPU tensor is allowed next to device tensors (a "CPU
    scalar", as TensorIterator allows), a 0-dim *device* tensor next to CPU tensors is not;
  * cross-device by design: ``copy_`` and ``_to_copy`` (``.to``, ``.cpu()``), and CPU *indices* of an indexing
    op (``x[cpu_idx]``, ``x[cpu_mask] = v``: CUDA moves them), while a device index into a CPU tensor is an
    error; ``index_select`` is no indexing op here (CUDA wants its index on the device too);
  * ``.item()``, ``.tolist()``, ``bool(t)`` read the value (CUDA synchronises); ``.numpy()`` raises as on
    CUDA.

Why not the meta device: meta tensors have no values, so ``nonzero``, ``unique``, boolean indexing,
``.item()`` and ``.tolist()`` (all used by packing, the shared-prompt pass and the chunked LM head) cannot
run, and a model on meta cannot produce log-probs to compare. Here the kernels are the CPU's, so a test can
compare with a plain CPU run: forwards bit for bit with eager attention; SDPA chooses its kernel by device
type (the math path here, a fused kernel on the CPU) and a few backward kernels differ in the last bit, so
those agree to ~5e-7 (float32).

What it does not model: the CUDA kernels themselves (numerics, SDPA backends, TF32), streams and asynchrony,
memory, and code that branches on ``device.type == "cuda"`` (it sees ``"fakegpu"``). Ops that CUDA accepts
with a 0-dim CPU operand only in some positions are accepted here in all (a missed error, never a false
alarm). Autocast on ``fakegpu`` is a no-op.

Import it in a process of its own: importing registers PrivateUse1 for good, and from then on
``torch.accelerator`` answers ``fakegpu`` (transformers, pinned memory and the autograd engine's stream
handling consult it), which must not leak into other tests, least of all CUDA ones.
``tests/test_device_placement.py`` runs it in a spawned worker.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "fakegpu"


class _BackendModule:
    """``torch.fakegpu``: what autocast and the RNG helpers ask a PrivateUse1 backend for."""

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.float16, torch.bfloat16]

    is_initialized = is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 1)
    current_device = staticmethod(lambda: 0)
    _is_in_bad_fork = staticmethod(lambda: False)
    manual_seed_all = staticmethod(lambda seed: None)


def _register_backend() -> torch.device:
    """Name PrivateUse1 ``fakegpu`` with a Python device guard and hooks (C++ code such as advanced indexing
    takes a device guard of the indexed tensor's device; without one it fails with "not linked with
    support"). Once per process: the name cannot change later, so a second import finds it set."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(rename=NAME, backend_module=_BackendModule())
    return torch.device(NAME, 0)


FAKE = _register_backend()
CPU = torch.device("cpu")

# Ops that move data between devices on purpose; the rule does not apply to them.
_CROSS_DEVICE = {
    torch.ops.aten._to_copy.default,
    torch.ops.aten.copy_.default,
    torch.ops.aten.copy.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
}
# Indexing ops: the indices (argument 1) may stay on the CPU when self is on the device (CUDA moves them).
_INDEXING = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
    torch.ops.aten._unsafe_index.Tensor,
    torch.ops.aten._unsafe_index_put.default,
}


class FakeDeviceTensor(torch.Tensor):
    """A tensor on ``fakegpu:0`` whose values live in ``self.inner``, a CPU tensor of its shape/strides."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, requires_grad: bool = False):
        assert type(inner) is torch.Tensor and inner.device.type == "cpu", type(inner)
        t = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=FAKE,
            requires_grad=requires_grad,
        )
        t.inner = inner
        return t

    # A traceable wrapper: ``nn.Module._apply`` (``model.to(fake)``) then swaps each parameter's contents in
    # place (``torch.utils.swap_tensors``) instead of replacing the Parameter object, so tied weights (an LM
    # head sharing the embedding) stay one tensor, as ``param.data = ...`` keeps them on CUDA.
    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return FakeDeviceTensor(inner_tensors["inner"])

    def __repr__(self, *, tensor_contents=None):
        return f"FakeDeviceTensor({self.inner!r}, device='{FAKE}')"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})

    # Python-level reads that do not reach the dispatcher as an op with a fake operand.
    def tolist(self):
        return self.inner.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(
            f"can't convert {FAKE.type}:{FAKE.index} device type tensor to numpy. Use "
            "Tensor.cpu() to copy the tensor to host memory first."
        )

    def __array__(self, dtype=None):
        return self.numpy()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # keep Python-level methods (tolist above) and everything else on the default path
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _device_of(x: torch.Tensor) -> torch.device:
    return FAKE if isinstance(x, FakeDeviceTensor) else x.device


def _is_fake_device(d) -> bool:
    return d is not None and torch.device(d).type == NAME


def _check_devices(func, args, kwargs) -> None:
    """Raise as CUDA does when the op's tensor operands are on different devices (see the module doc)."""
    if func in _CROSS_DEVICE:
        return
    operands = list(args) + list(kwargs.values())
    if func in _INDEXING and len(args) > 1 and isinstance(args[0], torch.Tensor):
        self_dev = _device_of(args[0])
        indices = [i for i in tree_flatten(args[1])[0] if isinstance(i, torch.Tensor)]
        for i in indices:
            if _device_of(i) != self_dev and _device_of(i) != CPU:
                raise RuntimeError(
                    f"indices should be either on cpu or on the same device as the indexed "
                    f"tensor ({self_dev}) ({func})"
                )
        operands = [args[0]] + list(args[2:]) + list(kwargs.values())
    tensors = [t for t in tree_flatten(operands)[0] if isinstance(t, torch.Tensor)]
    devices = {_device_of(t) for t in tensors if not (_device_of(t) == CPU and t.dim() == 0)}
    if len(devices) > 1:
        names = " and ".join(sorted(str(d) for d in devices))
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{names}! ({func})"
        )


def _dispatch(func, args, kwargs):
    _check_devices(func, args, kwargs)
    target = kwargs.get("device")
    on_fake = _is_fake_device(target) or (
        target is None and any(isinstance(t, FakeDeviceTensor) for t in tree_flatten((args, kwargs))[0])
    )
    if _is_fake_device(target):
        kwargs = {**kwargs, "device": CPU}
    wrappers = {}  # id(inner) -> its wrapper, so an in-place op / out= returns the very tensor it was given

    def unwrap(x):
        if isinstance(x, FakeDeviceTensor):
            wrappers[id(x.inner)] = x
            return x.inner
        return x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if not on_fake:
        return out

    def wrap(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in wrappers:
            return wrappers[id(x)]
        return FakeDeviceTensor(x)

    return tree_map(wrap, out)


class _FakeDeviceMode(TorchDispatchMode):
    """Sees every op, so plain CPU tensors meeting fake ones, ``.to(fake)`` and ``device=fake`` factories are
    handled too (without the mode an op on plain tensors only never reaches ``FakeDeviceTensor``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _is_fake_device(kwargs.get("device")) and not any(
            isinstance(t, FakeDeviceTensor) for t in tree_flatten((args, kwargs))[0]
        ):
            return func(*args, **kwargs)  # a plain CPU op: untouched
        return _dispatch(func, args, kwargs)


# Constructors from Python data build their tensor with the Python dispatch key excluded, so the dispatch mode
# never sees them: build on the CPU, then ``.to(fake)`` (an op the mode does see).
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}


class _FromDataMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_DATA and _is_fake_device(kwargs.get("device")):
            return func(*args, **{**kwargs, "device": CPU}).to(FAKE)
        return func(*args, **kwargs)


@contextmanager
def fake_device():
    """Enable ``fakegpu``; yields the device (``fakegpu:0``). Tensors made inside keep working after it, but
    factories and ``.to(fake)`` need it active."""
    with _FromDataMode(), _FakeDeviceMode():
        yield FAKE

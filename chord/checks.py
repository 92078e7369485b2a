"""Argument checks of every public entry point, in one place and one message form:

    <function>: <argument> must <what was expected>, got <what was given>

Used by chord.formats, chord.routing, chord.reference, chord.ops and the `humming` root, so a
user sees the same shape of message whichever layer refused the call. Type problems raise
TypeError, value problems ValueError; every check runs on the host before any launch.
"""
from __future__ import annotations

from typing import Any, NoReturn

import torch
from torch._subclasses.fake_tensor import FakeTensor

ALIGN_BYTES = 16  # the kernels read and write 16-byte vectors

# Sizes refused before anything is allocated (a typo of 10**9 experts would otherwise end in an
# allocator error of gigabytes, or worse, succeed on a large host). Routing and layer configs
# allocate per expert; no MoE model Chord serves comes near this many experts.
MAX_EXPERTS = 1 << 16
# Route ids, sorted-id positions and padded counts are int32 in vLLM's routing contract.
MAX_INT32 = 2**31 - 1


def where(fn: str, name: str) -> str:
    """``"<fn>: <name>"``, the head of every message."""
    return f"{fn}: {name}"


def plain(t: Any) -> bool:
    """A tensor with real storage at a real address: a plain tensor or an ``nn.Parameter``
    (vLLM's layer weights; subclasses included), not a FakeTensor or other tracing subclass."""
    return type(t) is torch.Tensor or (isinstance(t, torch.nn.Parameter) and not isinstance(t, FakeTensor))


def has_memory(t: Any) -> bool:
    """A tensor whose memory the checks can see: real storage at a real address. Plain tensors,
    parameters and every other subclass with storage (``as_subclass``) count; a FakeTensor of
    torch.compile tracing, a meta tensor and a wrapper subclass without storage do not (they
    have no address to align or compare). The memory checks (alignment, aliasing) use this, so a
    subclass is checked like the plain tensor it wraps."""
    if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.is_meta:
        return False
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return True
    try:
        t.data_ptr()
    except RuntimeError:  # a wrapper subclass (FunctionalTensor, ...): no storage of its own
        return False
    return True


def fail(fn: str, name: str, expected: str, given: Any, exc: type = ValueError) -> NoReturn:
    """Raise ``exc("<fn>: <name> must <expected>, got <given>")``."""
    raise exc(f"{where(fn, name)} must {expected}, got {given}")


def _dtype(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def integer(fn: str, name: str, v: Any, *, min: int | None = None, max: int | None = None) -> int:
    """`v` as an int (a bool is refused: it is an int to Python, never to the caller)."""
    if not is_int(v):  # a number of the wrong kind (a bool, a float) is a bad value; anything else a bad type
        fail(fn, name, "be an int" + (f" >= {min}" if min is not None else ""), f"{v!r} ({type(v).__name__})",
             ValueError if isinstance(v, (int, float)) else TypeError)
    if min is not None and v < min:
        fail(fn, name, f"be >= {min}", v)
    if max is not None and v > max:
        fail(fn, name, f"be <= {max}", v)
    return v


def top_k(fn: str, v: Any) -> int:
    """`v` as top_k: a positive int (a bool, a float such as 2.7, 0 and negatives are refused;
    chord.ops and the `humming` root say it the same way)."""
    if not is_int(v) or v < 1:
        raise ValueError(f"{where(fn, 'top_k')} must be a positive int, got {v!r}")
    return v


def boolean(fn: str, name: str, v: Any, *, allow_none: bool = False) -> bool | None:
    """`v` as a bool (an int 0/1 is refused: say True or False)."""
    if v is None and allow_none:
        return None
    if not isinstance(v, bool):
        fail(fn, name, "be a bool" + (" or None" if allow_none else ""), f"{v!r} ({type(v).__name__})", TypeError)
    return v


def one_of(fn: str, name: str, v: Any, options) -> Any:
    if v not in options:
        fail(fn, name, f"be one of {', '.join(map(repr, options))}", repr(v))
    return v


def tensor(fn: str, name: str, t: Any, *, dtype=None, ndim=None, what: str | None = None, device=None,
           like: str = "x", contiguous: bool = False, aligned: bool | int = False, optional: bool = False) -> None:
    """`t` is a torch.Tensor (None only when `optional`) of one of `dtype`, of rank `ndim` (an int or
    a tuple; `what` describes the expected shape, e.g. "2-D [M, K]"), on `device` (the device of
    the argument `like`), contiguous, and starting at an aligned address: `aligned=True` is the
    16-byte alignment of the kernels' vector accesses, an int that many bytes (the routing
    tensors, read one element at a time: their element size)."""
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        fail(fn, name, "be a torch.Tensor" + (" or None" if optional else ""), type(t).__name__, TypeError)
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            fail(fn, name, f"have dtype {' or '.join(_dtype(d) for d in allowed)}", _dtype(t.dtype), TypeError)
    if ndim is not None:
        dims = ndim if isinstance(ndim, tuple) else (ndim,)
        if t.dim() not in dims:
            fail(fn, name, f"be {what or ' or '.join(f'{d}-D' for d in dims)}", f"shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        fail(fn, name, f"be on {device} (like {like})", t.device)
    if contiguous and not t.is_contiguous():
        fail(fn, name, "be contiguous (call .contiguous())", f"strides {tuple(t.stride())} for shape {tuple(t.shape)}")
    if aligned:
        need = ALIGN_BYTES if aligned is True else aligned
        if has_memory(t) and t.numel() and t.data_ptr() % need:
            why = ("the kernels move 16-byte vectors" if need == ALIGN_BYTES
                   else f"the kernels read it with {need}-byte loads")
            fail(fn, name, f"start at a {need}-byte aligned address ({why}; a view at an odd offset is not: "
                           "copy it)", f"address offset {t.data_ptr() % need}")


def same_device(fn: str, name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.device != b.device:
        fail(fn, name_a, f"be on the device of {name_b} ({b.device})", a.device)

"""ckpt.torch: PyTorch state dicts saved and restored through ckptd.

    from ckpt.torch import Checkpointer
    ck = Checkpointer("my-job", rank=0, world=1)      # endpoint None: $CKPT_ENDPOINT
    ck.attach(opt)                                     # optional: see below
    h = ck.save(step, {"model": model.state_dict(), "optim": opt.state_dict()},
                meta={"loss": loss})
    h.wait("CAPTURED"); h.result()                     # COMMITTED, or raises ckpt.Error
    step, meta = ck.load(sd, step=ckpt.LATEST)         # in place, like dcp.load

What is saved: every tensor of the (nested dicts, lists and tuples) state
dict, named by its path joined with "." ("model.fc.weight",
"optim.state.0.exp_avg": the names DCP gives, and the names in the shard's
safetensors file); the other values (numbers, strings, None, the
structure) as JSON in a tensor of the rank's own ("ckpt.torch.tree.RANK").
A value that cannot be represented (an object, a complex tensor, a
non-contiguous tensor, a dict key that is neither str nor int) raises
ckpt.Error (EINVAL) naming its path before anything is sent.

Where the bytes come from, and who copies them:
- A tensor on a CUDA device goes to the agent through the CUDA IPC
  transport (its data pointer: no copy in the trainer) when it is a
  parameter or optimizer state of an attached optimizer; any other CUDA
  tensor is copied on the current stream into a buffer of the plan on the
  same device (device to device), so work queued on that stream after save
  may change it.
- A CPU tensor is copied at save time into ckpt host memory of the plan
  (a memcpy in the trainer), unless it already lives in ckpt host memory
  and is a parameter or optimizer state of an attached optimizer:
  attach(opt) moves those there once (then later saves copy nothing in
  the trainer; the agent reads them while the trainer goes on).
- A state dict holds CPU tensors and tensors of at most one CUDA device; CPU
  tensors beside CUDA ones (AdamW's "step") are copied into the plan's
  buffer on that device.
- Sharded tensors: a DTensor (Shard placements, or Replicate) and a
  ShardedTensor with one local shard are saved as their local box of the
  global tensor: another world size or split restores from them.

When the trainer may write the tensors again: a tensor that was copied,
as soon as save returns. A tensor the agent reads in place (attached),
once the save is CAPTURED: attach(opt) waits for that in a pre-step hook
of the optimizer (CPU), or makes the CUDA stream wait there without
blocking the host (ckpt_save_fence), so capture overlaps the next forward
and backward. Without attach, nothing is read in place and save never
waits for capture, except that a save waits for the previous one to be
captured before reusing the plan's buffer.

The plan is cached per state-dict structure (names, dtypes, shapes, and the
addresses of what is read in place); a new structure makes a new plan once
the previous plan's saves are captured. One Checkpointer per rank; use it
from one thread.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import math
import os
import struct
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import (CAPTURED, COMMITTED, DURABLE, FAILED, LATEST, QUEUED, SKIPPED, UPLOADED,
               Client, Error, Tensor as _CTensor, state_name)

__all__ = ["Checkpointer", "SaveHandle"]

_DTYPES: Dict[torch.dtype, str] = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float32: "F32", torch.float64: "F64",
}
for _n, _s in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
               ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _n):
        _DTYPES[getattr(torch, _n)] = _s
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_STATES = {"QUEUED": QUEUED, "CAPTURED": CAPTURED, "DURABLE": DURABLE,
           "COMMITTED": COMMITTED, "UPLOADED": UPLOADED}
_ALIGN = 64  # every tensor copied into a plan's buffer starts at a multiple of this
_TREE_MIN = 4096
_HEAD = 16  # a rank's head tensor: its tree's capacity and length (u64 LE each)


def _einval(msg: str) -> Error:
    return Error(_errno.EINVAL, msg)


def _head_name(rank: int) -> str:
    return "ckpt.torch.%d" % rank


def _tree_name(rank: int) -> str:
    return "ckpt.torch.tree.%d" % rank


# ---- the state dict, flattened ------------------------------------------


class _Entry:
    """One tensor of a state dict: its name, where it is (for messages),
    the tensor as given, the local tensor saved, and its global box."""

    __slots__ = ("name", "where", "tensor", "local", "dtype", "gshape", "goff", "alias")

    def __init__(self, name, where, tensor, local, gshape, goff):
        self.name, self.where, self.tensor, self.local = name, where, tensor, local
        self.dtype = _DTYPES[local.dtype]
        self.gshape, self.goff, self.alias = gshape, goff, None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.local)


def _sharded(t: torch.Tensor, where: str):
    """The local tensor, global shape and offset of a DTensor or a
    ShardedTensor (None, None for a plain tensor)."""
    kind = type(t).__name__
    if kind == "DTensor":
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        for p in t.placements:
            if p.is_partial():
                raise _einval("%s: a DTensor with a Partial placement has no value to save "
                              "until it is reduced (redistribute it to Replicate or Shard)"
                              % where)
        shape, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh,
                                                           t.placements)
        local = t.to_local()
        if tuple(local.shape) != tuple(shape):
            raise _einval("%s: the DTensor's local tensor has shape %s, its placements say %s "
                          "(uneven sharding is not supported)"
                          % (where, tuple(local.shape), tuple(shape)))
        return local, list(t.shape), [int(o) for o in off]
    if kind == "ShardedTensor":
        shards = t.local_shards()
        if len(shards) != 1:
            raise _einval("%s: a ShardedTensor with %d local shards: one per rank is supported"
                          % (where, len(shards)))
        md = shards[0].metadata
        return shards[0].tensor, list(t.size()), [int(o) for o in md.shard_offsets]
    return t, None, None


def _boxed_scalar(local: torch.Tensor, gshape, goff):
    """A 0-d tensor given a global box (a replicated scalar, as AdamW's
    "step") is saved as one element of shape [1]: the protocol tells a
    sharded tensor by its global dimensions, which a scalar has none of."""
    if gshape is not None and local.dim() == 0:
        return local.view(1), [1], [0]
    return local, gshape, goff


def _encode_scalar(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 63) else {"I": str(v)}
    if isinstance(v, float):
        return v if math.isfinite(v) else {"F": repr(v)}
    raise _einval("%s: a value of type %s cannot be saved: state dicts hold tensors, "
                  "numbers, strings, None, and dicts, lists and tuples of them"
                  % (where, type(v).__qualname__))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tree_fault(tree: Any) -> Optional[str]:
    """What is wrong with a tree read back (None: it is one save can write),
    checked before anything uses it. Iterative: a deep tree is no danger."""
    if not (isinstance(tree, dict) and len(tree) == 1 and "D" in tree):
        return "the tree is not a dict node"
    todo = [tree]
    while todo:
        node = todo.pop()
        if node is None or isinstance(node, (bool, str)) or _is_int(node):
            continue
        if isinstance(node, float):
            if not math.isfinite(node):
                return "a float that is not finite"
            continue
        if not isinstance(node, dict) or len(node) != 1:
            return "a node that is not a one-key object: %.60r" % (node,)
        (kind, v), = node.items()
        if kind == "D":
            if not isinstance(v, list) or not all(
                    isinstance(p, list) and len(p) == 2 and
                    (isinstance(p[0], str) or _is_int(p[0])) for p in v):
                return "a dict node that is not a list of [str or int key, node]"
            todo += [p[1] for p in v]
        elif kind in ("L", "U"):
            if not isinstance(v, list):
                return "a list node that is not a list"
            todo += v
        elif kind == "T":
            shapes = v[1:] if isinstance(v, list) and len(v) in (2, 4) else None
            if not shapes or v[0] not in _TORCH_DTYPES or not all(
                    isinstance(x, list) and len(x) <= 16 and
                    all(_is_int(d) and d >= 0 for d in x) for x in shapes) or \
                    (len(shapes) == 3 and len(shapes[1]) != len(shapes[2])):
                return "a tensor node that is not [dtype, shape(, global shape, offset)]"
        elif kind == "A":
            if not isinstance(v, str):
                return "an alias that is not a name"
        elif kind == "I":
            if not (isinstance(v, str) and v.lstrip("-").isdigit() and len(v) < 10000):
                return "a big int that is not a string of digits"
        elif kind == "F":
            if v not in ("nan", "inf", "-inf"):
                return "a float node that is not nan, inf or -inf"
        else:
            return "an unknown node %r" % kind
    return None


def _decode_scalar(v: Any) -> Any:
    if isinstance(v, dict):
        if "I" in v:
            return int(v["I"])
        return float(v["F"])
    return v


class _Flat:
    """A state dict taken apart: its tensors (entries) and a JSON tree of
    the rest, where each tensor is {"T": [dtype, shape(, gshape, goff)]}
    or {"A": name} (the same tensor as an earlier entry)."""

    def __init__(self, sd: Any, replicated: bool = False):
        self.replicated = replicated
        if not isinstance(sd, dict):
            raise _einval("the state dict must be a dict, not %s" % type(sd).__qualname__)
        self.entries: List[_Entry] = []
        self._names: Dict[str, str] = {}
        self._seen: Dict[tuple, str] = {}
        self.tree = self._walk(sd, "", "state_dict")

    def _tensor(self, t: torch.Tensor, name: str, where: str) -> Any:
        if not name:
            raise _einval("%s: the state dict itself cannot be a tensor" % where)
        local, gshape, goff = _sharded(t, where)
        if gshape is None and self.replicated:  # the same on every rank: one box
            gshape, goff = list(local.shape), [0] * local.dim()
        if local.dtype not in _DTYPES:
            raise _einval("%s: dtype %s cannot be saved (ckptd keeps the safetensors dtypes: %s)"
                          % (where, local.dtype,
                             ", ".join(str(d).replace("torch.", "") for d in _DTYPES)))
        if local.device.type not in ("cpu", "cuda"):
            raise _einval("%s: a tensor on %s: ckptd saves CPU and CUDA tensors"
                          % (where, local.device))
        if not local.is_contiguous():
            raise _einval("%s: the tensor is not contiguous (shape %s, stride %s): save "
                          "t.contiguous() instead, or make it contiguous where it is made"
                          % (where, tuple(local.shape), local.stride()))
        if len(local.shape) > 16:
            raise _einval("%s: %d dimensions: ckptd keeps at most 16" % (where, local.dim()))
        key = (local.device, local.data_ptr(), local.dtype, tuple(local.shape),
               tuple(gshape or ()), tuple(goff or ()))
        if local.numel() and key in self._seen:
            return {"A": self._seen[key]}
        self._seen[key] = name
        node = [_DTYPES[local.dtype], list(local.shape)]
        local, gshape, goff = _boxed_scalar(local, gshape, goff)
        e = _Entry(name, where, t, local, gshape, goff)
        self.entries.append(e)
        if gshape is not None:
            node += [gshape, goff]
        return {"T": node}

    def _walk(self, v: Any, name: str, where: str) -> Any:
        if isinstance(v, torch.Tensor):
            if name in self._names:
                raise _einval("%s and %s both make the tensor name %r: rename one of the keys"
                              % (self._names[name], where, name))
            self._names[name] = where
            return self._tensor(v, name, where)
        if isinstance(v, dict):
            items = []
            for k, x in v.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise _einval("%s: key %r: dict keys must be str or int to be saved"
                                  % (where, k))
                items.append([k, self._walk(x, "%s.%s" % (name, k) if name else str(k),
                                            "%s[%r]" % (where, k))])
            return {"D": items}
        if isinstance(v, (list, tuple)):
            out = [self._walk(x, "%s.%d" % (name, i) if name else str(i), "%s[%d]" % (where, i))
                   for i, x in enumerate(v)]
            return {"U" if isinstance(v, tuple) else "L": out}
        return _encode_scalar(v, where)


def _tree_bytes(flat: _Flat) -> Tuple[bytes, int]:
    """The tree as JSON, and the capacity of its tensor (a power of two, at
    least 4 KiB: the plan stays the same while values change size)."""
    text = json.dumps({"ckpt.torch": 1, "tree": flat.tree}, separators=(",", ":"),
                      allow_nan=False).encode()
    cap = _TREE_MIN
    while cap < len(text):
        cap *= 2
    return text, cap


class _Loaded:
    """A saved tree laid over a given state dict (Checkpointer.load): the
    values to set, the tensors to make, the aliases to copy."""

    _NONE = object()

    def __init__(self, flat: _Flat, own: bool = True):
        self.own = own  # the tree is this rank's (not rank 0's, read for another world)
        self.tensors = {e.name: e for e in flat.entries}  # by name: given or made
        self.made: List[_Entry] = []
        self.aliases: List[Tuple[torch.Tensor, str]] = []

    def build(self, node: Any, name: str, where: str) -> Any:
        """The saved value at `name`, made anew."""
        if not isinstance(node, dict) or "I" in node or "F" in node:
            return _decode_scalar(node)
        if "T" in node:
            dtype, shape, g = node["T"][0], node["T"][1], node["T"][2:]
            whole = bool(g) and list(g[0]) == (list(shape) or [1]) and not any(g[1])
            if g and not whole and not self.own:
                raise _einval("%s: a sharded tensor the state dict lacks, and this rank's "
                              "box of it is not known (it was saved by another world "
                              "size): give it in the state dict" % where)
            if dtype not in _TORCH_DTYPES:
                raise Error(_errno.EBADMSG, "%s: the checkpoint says dtype %r" % (where, dtype))
            t = torch.empty(shape, dtype=_TORCH_DTYPES[dtype])
            local, gs, go = _boxed_scalar(t, g[0] if g else None, g[1] if g else None)
            e = _Entry(name, where, t, local, gs, go)
            self.tensors[name] = e
            self.made.append(e)
            return t
        if "A" in node:
            e = self.tensors.get(node["A"])
            if e is None:
                raise Error(_errno.EBADMSG, "%s: the checkpoint says it is the tensor %r, "
                            "which it does not have" % (where, node["A"]))
            return e.tensor
        if "D" in node:
            return {k: self.build(c, self._name(name, k), "%s[%r]" % (where, k))
                    for k, c in node["D"]}
        kind = "L" if "L" in node else "U"
        out = [self.build(c, self._name(name, i), "%s[%d]" % (where, i))
               for i, c in enumerate(node[kind])]
        return out if kind == "L" else tuple(out)

    @staticmethod
    def _name(name: str, k: Any) -> str:
        return "%s.%s" % (name, k) if name else str(k)

    def apply(self, given: Any, node: Any, name: str, where: str) -> Any:
        """The value to hold at `name`: `given` itself where it is a tensor
        the checkpoint has, or a dict or list updated in place."""
        if isinstance(node, dict):
            if "T" in node and isinstance(given, torch.Tensor) and name in self.tensors:
                return given
            if "A" in node and isinstance(given, torch.Tensor):
                e = self.tensors.get(node["A"])
                if e is not None and e.tensor is not given:
                    self.aliases.append((given, node["A"]))
                return given
            if "D" in node and isinstance(given, dict):
                for k, c in node["D"]:
                    given[k] = self.apply(given.get(k, self._NONE), c, self._name(name, k),
                                          "%s[%r]" % (where, k))
                return given
            kind = "L" if "L" in node else "U" if "U" in node else None
            if kind and isinstance(given, list if kind == "L" else tuple):
                out = [self.apply(given[i] if i < len(given) else self._NONE, c,
                                  self._name(name, i), "%s[%d]" % (where, i))
                       for i, c in enumerate(node[kind])]
                if kind == "U":
                    return tuple(out)
                given[:] = out
                return given
        return self.build(node, name, where)


def _aliases(node: Any, name: str, out: Dict[str, str]) -> Dict[str, str]:
    """The names the saved tree says are another tensor: name -> its name."""
    if isinstance(node, dict):
        if "A" in node:
            out[name] = node["A"]
        for k, c in node.get("D", ()):
            _aliases(c, _Loaded._name(name, k), out)
        for i, c in enumerate(node.get("L", node.get("U", ()))):
            _aliases(c, _Loaded._name(name, i), out)
    return out


# ---- memory: ckpt host regions and a plan's buffers ----------------------


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _packed(sizes) -> Tuple[List[int], int]:
    """Offsets for blocks of `sizes` bytes laid one after another, each at
    a multiple of _ALIGN, and the bytes they take in all."""
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off = _aligned(off + n)
    return offsets, off


def _view(buf: Any, off: int, dtype: torch.dtype, shape) -> torch.Tensor:
    """A tensor of `shape` at byte `off` of a flat uint8 tensor `buf`."""
    n = 1
    for d in shape:
        n *= d
    size = n * torch.empty((), dtype=dtype).element_size()
    return buf[off:off + size].view(dtype).view(shape) if size else \
        torch.empty(shape, dtype=dtype, device=buf.device)


class _Region:
    """ckpt host memory (shared with the agent) with a uint8 tensor over it."""

    def __init__(self, client: Client, nbytes: int):
        self.mem = client.host_alloc(max(nbytes, 1))
        self.start, self.end = self.mem.address, self.mem.address + self.mem.size
        self.buf = torch.frombuffer(self.mem.buffer(), dtype=torch.uint8)

    def holds(self, t: torch.Tensor) -> bool:
        p = t.data_ptr()
        return t.device.type == "cpu" and self.start <= p and \
            p + _nbytes(t) <= self.end

    def free(self) -> None:
        self.buf = None
        self.mem.free()


class SaveHandle:
    """A save in flight (Checkpointer.save)."""

    def __init__(self, ck: "Checkpointer", save: Any, step: int, keep: list):
        self._ck, self._s, self.step = ck, save, step
        self._keep = keep  # what the agent reads in place, alive until captured

    @property
    def state(self) -> str:
        """QUEUED, CAPTURED, DURABLE, COMMITTED, UPLOADED, FAILED or SKIPPED."""
        return state_name(self._s.state)

    @property
    def reason(self) -> str:
        """Why it failed or was skipped ("" otherwise)."""
        return self._s.reason

    def wait(self, state: Union[str, int] = "CAPTURED", timeout: Optional[float] = None) -> None:
        """Until the save reaches `state` (a name or ckpt.CAPTURED ...):
        raises ckpt.Error if it failed, was skipped or the time ran out."""
        want = _STATES.get(state, 0) if isinstance(state, str) else state
        if not want:
            raise _einval("state %r: one of %s" % (state, ", ".join(_STATES)))
        try:
            self._s.wait(want, -1 if timeout is None else int(timeout * 1000))
        except Error as e:
            why = self._s.reason or e.strerror
            raise Error(e.errno, "save of step %d did not reach %s: %s (%s)"
                        % (self.step, state_name(want), why, self.state)) from None
        if want >= CAPTURED:
            self._keep = None

    def done(self) -> bool:
        """Whether it has committed or ended (FAILED, SKIPPED)."""
        return self._s.state in (COMMITTED, UPLOADED, FAILED, SKIPPED)

    def result(self, timeout: Optional[float] = None) -> str:
        """Waits for COMMITTED and returns "COMMITTED"; raises ckpt.Error with
        the agent's reason if the save failed or was skipped."""
        self.wait(COMMITTED, timeout)
        self._keep = None
        return "COMMITTED"

    def _captured_quietly(self) -> None:
        """Waits for CAPTURED or the end; a failure shows in result()."""
        try:
            self._s.wait(CAPTURED, -1)
        except Error:
            pass
        self._keep = None


class _Plan:
    """A libckpt plan for one state-dict structure, on one device, with its
    buffer for what is copied at save time."""

    def __init__(self, ck: "Checkpointer", key: tuple, flat: _Flat, inplace: List[bool],
                 tree_cap: int, device: torch.device):
        self.key, self.device, self.tree_cap = key, device, tree_cap
        self.inplace, self.last = inplace, None
        cuda = device.type == "cuda"
        copied, off = _packed(e.nbytes for e, ip in zip(flat.entries, inplace) if not ip)
        it = iter(copied)
        self.offsets = [None if ip else next(it) for ip in inplace]
        self.tree_off = off  # the head, then the tree at tree_off + _ALIGN
        total = off + _ALIGN + tree_cap
        self.region = None if cuda else _Region(ck._client, total)
        if cuda:
            self.buf = torch.empty(total, dtype=torch.uint8, device=device)
            base = self.buf.data_ptr()
            # what comes from host memory goes through pinned memory to the device
            _, host = _packed(e.nbytes for e, ip in zip(flat.entries, inplace)
                              if not ip and e.local.device.type == "cpu")
            self.pinned = torch.empty(host + _ALIGN + tree_cap, dtype=torch.uint8,
                                      pin_memory=True)
            self.h2d_done = None
        else:
            self.buf, base = self.region.buf, self.region.start
        tensors = [_CTensor(e.name, dtype=e.dtype, shape=tuple(e.local.shape),
                            address=e.local.data_ptr() if ip else base + o,
                            global_shape=e.gshape, global_offset=e.goff)
                   for e, ip, o in zip(flat.entries, inplace, self.offsets)]
        # head and tree as boxes of their own global tensors: other ranks may
        # read them (another world size) while this one does
        tensors.append(_CTensor(_head_name(ck.rank), dtype="U8", shape=(_HEAD,),
                                address=base + self.tree_off, global_shape=[_HEAD],
                                global_offset=[0]))
        tensors.append(_CTensor(_tree_name(ck.rank), dtype="U8", shape=(tree_cap,),
                                address=base + self.tree_off + _ALIGN,
                                global_shape=[tree_cap], global_offset=[0]))
        try:
            self.plan = ck._client.plan(ck.job, ck.rank, ck.world, tensors, **ck._plan_opts)
        except BaseException:
            if self.region is not None:
                self.region.free()
            raise

    def fill(self, flat: _Flat, tree: bytes) -> None:
        """Copies what is not read in place into the buffer: after the
        previous save of this plan is captured (it may still read it)."""
        if self.device.type == "cuda":
            return self._fill_cuda(flat, tree)
        if self.last is not None:
            self.last._captured_quietly()
        for e, o in zip(flat.entries, self.offsets):
            if o is not None and e.nbytes:
                _view(self.buf, o, e.local.dtype, e.local.shape).copy_(e.local)
        self._put_tree(self.buf, self.tree_off, tree)

    def _put_tree(self, buf: torch.Tensor, off: int, tree: bytes) -> None:
        """The head (the tree's capacity and length) and the tree at `off`."""
        head = struct.pack("<QQ", self.tree_cap, len(tree)).ljust(_ALIGN, b"\0")
        data = head + tree + b" " * (self.tree_cap - len(tree))  # JSON allows blanks
        buf[off:off + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def _fill_cuda(self, flat: _Flat, tree: bytes) -> None:
        stream = torch.cuda.current_stream(self.device)
        if self.last is not None:  # the stream, not the host, waits for the last capture
            self.last._s.fence(stream.cuda_stream)
        if self.h2d_done is not None:  # the pinned buffer is free once its copy ran
            self.h2d_done.synchronize()
        poff = 0
        for e, o in zip(flat.entries, self.offsets):
            if o is None or not e.nbytes:
                continue
            dst = _view(self.buf, o, e.local.dtype, e.local.shape)
            if e.local.device.type == "cpu":
                pin = _view(self.pinned, poff, e.local.dtype, e.local.shape)
                pin.copy_(e.local)
                dst.copy_(pin, non_blocking=True)
                poff = _aligned(poff + e.nbytes)
            else:
                dst.copy_(e.local, non_blocking=True)
        self._put_tree(self.pinned, poff, tree)
        n = _ALIGN + self.tree_cap
        self.buf[self.tree_off:self.tree_off + n].copy_(self.pinned[poff:poff + n],
                                                        non_blocking=True)
        self.h2d_done = torch.cuda.Event()
        self.h2d_done.record(stream)

    def destroy(self) -> None:
        if self.last is not None:
            self.last._captured_quietly()
        self.plan.destroy()
        if self.region is not None:
            self.region.free()
        self.buf = self.region = None


# ---- the checkpointer ------------------------------------------------------


def _agree(got: int, world: int) -> int:
    """The step every rank of the job restores, where torch.distributed runs
    them (a process group of `world` ranks): the smallest any of them
    restored. A rank that passed over a damaged newer step (in a file only
    it reads) and one that did not would otherwise go on from different
    steps. A rank that failed gives -errno, so that every rank learns of it
    and none waits. One all_reduce, on the group's device; else got."""
    dist = getattr(torch, "distributed", None)
    if world <= 1 or dist is None or not dist.is_available() or not dist.is_initialized() or \
            dist.get_world_size() != world:
        return got
    dev = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([got], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


class Checkpointer:
    """Saves and restores one rank's state dicts through ckptd."""

    def __init__(self, job: str, rank: int = 0, world: int = 1,
                 endpoint: Optional[str] = None, *, run: Optional[str] = None,
                 copies: int = 0, backpressure: int = 0, replicated: bool = False):
        """job: the job's name; rank of world; endpoint None: $CKPT_ENDPOINT,
        else the default socket. run, copies, backpressure: the plan options
        of ckpt.Client.plan. replicated: the plain (not sharded) tensors are
        the same on every rank that has them (data parallel): each is saved
        as one box the ranks share, written once (ckptd's dedup), restored
        by any rank. Without it a plain tensor belongs to its rank, and two
        ranks saving one name is an error."""
        self.job, self.rank, self.world = job, rank, world
        self.replicated = replicated
        self._plan_opts = {"run": run, "copies": copies, "backpressure": backpressure}
        self._client = Client(endpoint)
        self._plan: Optional[_Plan] = None
        self._regions: List[_Region] = []
        self._moved: List[weakref.ref] = []
        self._optims: List[Any] = []
        self._hooks: List[Any] = []
        self._pending: List[SaveHandle] = []

    # -- attach: the optimizer's step waits for capture ---------------------

    def attach(self, optimizer: torch.optim.Optimizer, move: bool = True) -> None:
        """Lets saves read the optimizer's parameters and state in place,
        the wait for CAPTURED placed before the optimizer's next step (a
        pre-step hook: CPU tensors wait on the host, CUDA ones through the
        stream). move: CPU parameters and state are moved once into ckpt
        host memory (their .data replaced; state made by a later step is
        moved after that step), so saves copy nothing in the trainer.
        Anything else that writes them between a save and the next step
        must call wait_captured() first. State dicts taken before attach view
        the old storage: take state_dict() after it (for every save, as DCP
        asks too)."""
        self._optims.append(optimizer)
        self._hooks.append(optimizer.register_step_pre_hook(self._before_step))
        if move:
            self._move(optimizer)
            self._hooks.append(optimizer.register_step_post_hook(
                lambda opt, args, kwargs: self._move(opt, lazily=True)))
            # load_state_dict puts new state tensors in: look again at the next step
            self._hooks.append(optimizer.register_load_state_dict_post_hook(
                lambda opt: setattr(opt, "_ckpt_moved", -1)))

    def wait_captured(self) -> None:
        """What the pre-step hook does: the saves not yet captured are waited
        for (CPU) or fenced on the current stream (CUDA)."""
        pending, self._pending = self._pending, []
        for h in pending:
            if self._plan is not None and self._plan.device.type == "cuda":
                h._s.fence(torch.cuda.current_stream(self._plan.device).cuda_stream)
            else:
                h._captured_quietly()

    def _before_step(self, opt, args, kwargs) -> None:
        self.wait_captured()

    @staticmethod
    def _tensors_of(opt) -> List[torch.Tensor]:
        """The optimizer's parameters and state tensors, as plain tensors
        (a DTensor's local tensor: what a state dict's entry reads)."""
        out = [p for g in opt.param_groups for p in g["params"]]
        out += [v for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor)]
        return [getattr(t, "_local_tensor", t) if type(t).__name__ == "DTensor" else t
                for t in out if type(t).__name__ != "ShardedTensor"]

    def _in_region(self, t: torch.Tensor) -> bool:
        return any(r.holds(t) for r in self._regions)

    def _move(self, opt, lazily: bool = False) -> None:
        """Moves the optimizer's CPU parameters and state tensors that are
        not yet in ckpt host memory there (one region for all of them)."""
        if lazily:
            n = sum(len(st) for st in opt.state.values())
            if getattr(opt, "_ckpt_moved", -1) == n:
                return
            opt._ckpt_moved = n
        todo, seen = [], set()
        for t in self._tensors_of(opt):
            if t.device.type != "cpu" or not t.numel() or not t.is_contiguous() or \
                    t.dtype not in _DTYPES or self._in_region(t) or id(t) in seen or \
                    type(t) not in (torch.Tensor, torch.nn.Parameter):
                continue  # a DTensor's local tensor stays where it is
            seen.add(id(t))
            todo.append(t)
        if not todo:
            return
        self.wait_captured()
        offsets, total = _packed(_nbytes(t) for t in todo)
        region = _Region(self._client, total)
        self._regions.append(region)
        for t, off in zip(todo, offsets):
            v = _view(region.buf, off, t.dtype, t.shape)
            v.copy_(t)
            t.data = v
            self._moved.append(weakref.ref(t))

    def _protected(self) -> set:
        return {(t.device, t.data_ptr()) for o in self._optims for t in self._tensors_of(o)}

    # -- save -----------------------------------------------------------------

    def save(self, step: int, state_dict: Dict[str, Any], meta: Any = None) -> SaveHandle:
        """Queues a save of `state_dict` as `step` (meta: a JSON value, kept
        in the manifest and returned by load). Returns once queued; what it
        copies is copied (see the module's docstring)."""
        flat = _Flat(state_dict, self.replicated)
        tree, cap = _tree_bytes(flat)
        if meta is not None and not isinstance(meta, str):
            try:
                meta = json.dumps(meta, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise _einval("meta: %s (it must be a JSON value)" % e) from None
        device = self._device(flat)
        inplace = self._inplace(flat, device)
        key = (device, cap, tuple((e.name, e.dtype, tuple(e.local.shape),
                                   tuple(e.gshape or ()), tuple(e.goff or ()),
                                   e.local.device, e.local.data_ptr() if ip else None)
                                  for e, ip in zip(flat.entries, inplace)))
        if self._plan is None or self._plan.key != key:
            self._drop_plan()
            try:
                self._plan = _Plan(self, key, flat, inplace, cap, device)
            except Error as e:
                raise self._hint(e) from None
        p = self._plan
        p.fill(flat, tree)
        if device.type == "cuda":
            s = p.plan.save_on(step, meta, torch.cuda.current_stream(device).cuda_stream)
        else:
            s = p.plan.save(step, meta)
        keep = [e.local for e, ip in zip(flat.entries, inplace) if ip]
        h = SaveHandle(self, s, step, keep)
        p.last = h
        if keep:
            self._pending.append(h)
        return h

    def _device(self, flat: _Flat) -> torch.device:
        cuda = {e.local.device for e in flat.entries if e.local.device.type == "cuda"}
        if len(cuda) > 1:
            names = sorted(str(d) for d in cuda)
            raise _einval("the state dict has tensors on %s: one Checkpointer saves the "
                          "tensors of one device (and CPU)" % " and ".join(names))
        if cuda:
            d = cuda.pop()
            return torch.device("cuda", d.index if d.index is not None
                                else torch.cuda.current_device())
        return torch.device("cpu")

    def _inplace(self, flat: _Flat, device: torch.device) -> List[bool]:
        """Which entries the agent reads in place: the attached optimizers'
        tensors, on the plan's device (and, on CPU, in ckpt host memory),
        none overlapping another."""
        prot = self._protected()
        out = []
        for e in flat.entries:
            t = e.local
            ok = bool(t.numel()) and (t.device, t.data_ptr()) in prot and \
                t.device == device and (device.type == "cuda" or self._in_region(t))
            out.append(ok)
        spans = sorted((flat.entries[i].local.data_ptr(), i)
                       for i, ok in enumerate(out) if ok)
        end = 0
        for ptr, i in spans:  # a view overlapping another is copied instead
            if ptr < end:
                out[i] = False
            else:
                end = ptr + flat.entries[i].nbytes
        return out

    def _hint(self, e: Error) -> Error:
        if e.errno == _errno.EINVAL and "is also saved by rank" in e.strerror and \
                not self.replicated:
            return Error(e.errno, e.strerror + ". If every rank holds the same values "
                         "(data parallel), pass replicated=True to Checkpointer; else give "
                         "each rank's tensors names of their own")
        return e

    def _drop_plan(self) -> None:
        self.wait_captured()
        if self._plan is not None:
            p, self._plan = self._plan, None
            p.destroy()

    # -- load -----------------------------------------------------------------

    def load(self, state_dict: Dict[str, Any], step: int = LATEST,
             fallback: bool = False, strict: bool = False) -> Tuple[int, Any]:
        """Restores `step` (LATEST: the newest committed) into `state_dict`
        in place: its tensors get the saved values (same dtype and shape, or
        the global tensor's box for sharded ones: another split is assembled
        by the agent), its other values are set from the checkpoint, and
        tensors the checkpoint has but the state dict lacks (a fresh
        optimizer's state) are made on CPU. Returns (the step, its meta).

        No checkpoint at all raises ckpt.NoCheckpoint (ENOENT: a fresh
        start); a committed one that cannot be read whole raises
        ckpt.DamagedCheckpoint (EBADMSG), never taken for none. With LATEST
        a damaged newest step is passed over for the newest that restores
        whole, with a ckpt.PassedOver warning (strict: the error instead;
        fallback: past any failure). Where torch.distributed runs the job's
        ranks, they agree on one step: the smallest any of them restored."""
        self._drop_plan()
        flat = _Flat(state_dict, self.replicated)
        try:
            got, meta, tree, own = self._read_tree(step, fallback, strict)
        except Error as e:
            if step != LATEST:
                raise
            _agree(-e.errno, self.world)  # the others learn it, none waits for this rank
            raise
        if step == LATEST:
            agreed = _agree(got, self.world)
            if agreed < 0:
                raise Error(-agreed, "job %s: another rank could not restore LATEST (%s; its "
                            "error says why): rank %d restores nothing either"
                            % (self.job, os.strerror(-agreed), self.rank))
            if agreed != got:  # another rank passed over a step this one read whole
                got, meta, tree, own = self._read_tree(agreed, False, True)
        aliases = _aliases(tree, "", {})
        by_device: Dict[torch.device, List[_Entry]] = {}
        for e in flat.entries:
            if e.name not in aliases:  # saved once, under the name it aliases
                by_device.setdefault(e.local.device, []).append(e)
        for dev in sorted(by_device, key=lambda d: (d.type != "cpu", str(d))):
            self._restore_into(by_device[dev], got)
        lay = _Loaded(flat, own)
        try:
            lay.apply(state_dict, tree, "", "state_dict")
        except (Error, TypeError, ValueError, KeyError, IndexError, AttributeError,
                RuntimeError) as e:  # a tree that is not what save writes
            if isinstance(e, Error) and e.errno != _errno.EBADMSG:
                raise type(e)(e.errno, "job %s step %d: %s" % (self.job, got,
                                                             e.strerror)) from None
            why = e.strerror if isinstance(e, Error) else repr(e)
            raise Error(_errno.EBADMSG, "job %s step %d: the ckpt.torch tree of rank %d "
                        "cannot be read: %s" % (self.job, got, self.rank, why)) from None
        self._restore_into(lay.made, got)
        for t, of in lay.aliases:
            t.copy_(lay.tensors[of].tensor)
        return got, meta

    def _restore_plan(self, entries: List[_Entry], addrs: List[int], step: int,
                      fallback: bool = False, strict: bool = False) -> Tuple[int, Any]:
        tensors = [_CTensor(e.name, dtype=e.dtype, shape=tuple(e.local.shape), address=a,
                            global_shape=e.gshape, global_offset=e.goff)
                   for e, a in zip(entries, addrs)]
        try:
            plan = self._client.plan(self.job, self.rank, self.world, tensors,
                                     **self._plan_opts)
        except Error as e:
            raise self._hint(e) from None
        try:
            return plan.restore(step, fallback, strict)
        finally:
            plan.destroy()

    def _restore_into(self, entries: List[_Entry], step: int) -> None:
        """Restores `entries` of `step`: CUDA ones and CPU ones in ckpt host
        memory in place, other CPU ones through a region, copied after."""
        entries = [e for e in entries if e.local.numel()]
        if not entries:
            return
        direct = [e.local.device.type == "cuda" or self._in_region(e.local) for e in entries]
        offsets, size = _packed(e.nbytes for e, d in zip(entries, direct) if not d)
        region = _Region(self._client, size) if size else None
        try:
            addrs, views, it = [], [], iter(offsets)
            for e, d in zip(entries, direct):
                if d:
                    addrs.append(e.local.data_ptr())
                    continue
                off = next(it)
                addrs.append(region.start + off)
                views.append((e, _view(region.buf, off, e.local.dtype, e.local.shape)))
            for dev in {e.local.device for e in entries if e.local.device.type == "cuda"}:
                # the agent writes on its own stream: work still queued on the
                # trainer's (the tensors' fill, say) must not run after it
                torch.cuda.current_stream(dev).synchronize()
            self._restore_plan(entries, addrs, step)
            for e, v in views:
                e.local.copy_(v)
        finally:
            if region is not None:
                region.free()

    def _restore_bytes(self, name: str, n: int, step: int, fallback: bool = False,
                       strict: bool = False) -> Tuple[int, Any, bytes]:
        """The U8 tensor `name` of `n` bytes of `step`: (step, meta, bytes)."""
        region = _Region(self._client, n)
        try:
            t = region.buf[:n]
            e = _Entry(name, name, t, t, [n], [0])
            got, meta = self._restore_plan([e], [region.start], step, fallback, strict)
            return got, meta, ctypes.string_at(t.data_ptr(), n)
        finally:
            region.free()

    def _read_tree(self, step: int, fallback: bool,
                   strict: bool = False) -> Tuple[int, Any, Any, bool]:
        """The step, its meta, this rank's tree (rank 0's where this rank
        has none: another world size), and whether it is this rank's."""
        err = None
        for rank in dict.fromkeys((self.rank, 0)):
            try:
                got, meta, head = self._restore_bytes(_head_name(rank), _HEAD, step, fallback,
                                                      strict)
            except Error as e:
                if e.errno != _errno.EINVAL or err is not None:
                    raise
                err = e  # no head for this rank: try rank 0's
                continue
            cap, n = struct.unpack("<QQ", head)
            if n > cap or cap > 1 << 40:
                raise Error(_errno.EBADMSG, "job %s step %d: %s says a tree of %d bytes in "
                            "%d: not a ckpt.torch head" % (self.job, got, _head_name(rank),
                                                           n, cap))
            _, _, text = self._restore_bytes(_tree_name(rank), cap, got)
            try:
                doc = json.loads(text[:n])
                if not (isinstance(doc, dict) and _is_int(doc.get("ckpt.torch")) and
                        doc["ckpt.torch"] == 1):
                    raise ValueError("no ckpt.torch version 1")
                fault = _tree_fault(doc.get("tree"))
                if fault:
                    raise ValueError(fault)
                return got, meta, doc["tree"], rank == self.rank
            except (ValueError, KeyError, TypeError, RecursionError) as e:
                raise Error(_errno.EBADMSG, "job %s step %d: %s is not a ckpt.torch tree (%s)"
                            % (self.job, got, _tree_name(rank), e)) from None
        raise Error(err.errno, "%s; was it saved through ckpt.torch.Checkpointer? (it has "
                    "no %s)" % (err.strerror, _head_name(self.rank))) from None

    # -- the end --------------------------------------------------------------

    def close(self) -> None:
        """Waits for the saves to be captured (their commit goes on in the
        agent), moves tensors attach() moved back into ordinary memory,
        removes the hooks and disconnects. State dicts taken before, which
        view ckpt host memory, must not be used after."""
        if self._client is None:
            return
        self._drop_plan()
        for h in self._hooks:
            h.remove()
        self._hooks, self._optims = [], []
        for ref in self._moved:
            t = ref()
            if t is not None and self._in_region(t):
                t.data = t.data.clone()
        self._moved = []
        for r in self._regions:
            r.free()
        self._regions = []
        self._client.close()
        self._client = None

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""ckpt: libckpt for Python, over ctypes (no build step).

The same shape as ckpt.h:

    import ckpt, numpy as np
    c = ckpt.Client()                          # $CKPT_ENDPOINT or the default socket
    mem = c.host_alloc(nbytes)                 # shared memory the agent reads and writes
    w = mem.ndarray(np.float32, (1024, 1024))  # a numpy view into it (offset=0)
    plan = c.plan("my-job", rank=0, world=1, tensors=[ckpt.Tensor("w", w)])
    save = plan.save(step=100, meta={"lr": 0.1})
    save.wait(ckpt.CAPTURED)                   # then train on
    step, meta = plan.restore(ckpt.LATEST)

Failures raise ckpt.Error with the errno and the agent's message; names,
meta and the endpoint holding NUL or control characters are refused with
EINVAL before anything reaches C (ctypes would cut them at the NUL). The
library is found through $CKPT_LIB, then libckpt.so.0 next to this
package, then libckpt.so.0 on the loader's path; when none loads, the
first call raises ckpt.Error (ELIBACC) naming each place tried.
numpy is only needed for Tensor(name, array) and HostMemory.ndarray.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import os
import re
from typing import Any, List, Optional, Sequence, Tuple

QUEUED, CAPTURED, DURABLE, COMMITTED, UPLOADED, FAILED, SKIPPED = range(1, 8)
LATEST = -1
COPIES_ALL = 0xFFFFFFFF  # every replica writes its own copy (plan option copies)
BLOCK, SKIP = 1, 2

DTYPES = {
    "BOOL": 1, "U8": 2, "I8": 3, "F8_E5M2": 4, "F8_E4M3": 5, "I16": 6, "U16": 7,
    "F16": 8, "BF16": 9, "I32": 10, "U32": 11, "F32": 12, "F64": 13, "I64": 14,
    "U64": 15,
}
_NUMPY_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "float64": "F64", "int64": "I64", "uint64": "U64",
}


class Error(OSError):
    """A libckpt failure: `errno` (a positive errno value), and the agent's
    message (`strerror`, and str(e))."""


class NoCheckpoint(Error):
    """A restore found no such checkpoint (ENOENT): the job has none
    committed (a fresh start), or not that step. The only restore error
    that means "start over"."""


class DamagedCheckpoint(Error):
    """A restore met a committed checkpoint that cannot be read whole
    (EBADMSG): a file missing or not what its manifest says, a checksum
    mismatch, an unreadable manifest. The message names the step, the rank
    and the file. Never a fresh start: repair the storage, or restore an
    older step by number."""


class PassedOver(UserWarning):
    """A restore of LATEST passed over damaged newer steps (the warning
    says which and why) and restored an older one."""


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("global_shape", ctypes.POINTER(ctypes.c_int64)),
        ("global_offset", ctypes.POINTER(ctypes.c_int64)),
    ]


class _RestoreOpts(ctypes.Structure):
    """struct ckpt_restore_opts (ckpt.h)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("fallback", ctypes.c_int),
        ("reserved", ctypes.c_uint),
        ("skipped", ctypes.c_void_p),
    ]


FALLBACK_DAMAGED, FALLBACK_NEVER, FALLBACK_ANY = 0, 1, 2


class _PlanOpts(ctypes.Structure):
    """struct ckpt_plan_opts (ckpt.h): its own size first, so it can grow."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("backpressure", ctypes.c_int),
        ("run", ctypes.c_char_p),
        ("copies", ctypes.c_uint),
        ("reserved", ctypes.c_uint),
    ]


def _candidates():
    """Where libckpt may be, in order, each with what to call it in a message."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libckpt.so.0")
    env = os.environ.get("CKPT_LIB")
    found = [(env, "$CKPT_LIB")] if env else []
    return found + [(here, "next to the package"), ("libckpt.so.0", "the loader's path")]


def _open_lib():
    tried = []
    if not os.environ.get("CKPT_LIB"):
        tried.append("$CKPT_LIB (not set)")
    for path, where in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({where}): {e}")
    raise Error(_errno.ELIBACC,
                "cannot load libckpt; tried " + "; ".join(tried) +
                ". Build it (README: cmake --build build) and set CKPT_LIB to "
                "build/client/libckpt.so, or install it (cmake --install, ldconfig)")


def _load():
    lib = _open_lib()
    vp, cp, i64, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int
    sigs = {
        "ckpt_connect": (i32, [cp, ctypes.POINTER(vp)]),
        "ckpt_agent_version": (cp, [vp]),
        "ckpt_disconnect": (None, [vp]),
        "ckpt_host_alloc": (i32, [vp, ctypes.c_size_t, ctypes.POINTER(vp)]),
        "ckpt_host_free": (None, [vp, vp]),
        "ckpt_plan_create_opts": (i32, [vp, cp, i32, i32, ctypes.POINTER(_Tensor),
                                        ctypes.c_size_t, ctypes.POINTER(_PlanOpts),
                                        ctypes.POINTER(vp)]),
        "ckpt_plan_destroy": (None, [vp]),
        "ckpt_plan_bytes": (ctypes.c_uint64, [vp]),
        "ckpt_save": (i32, [vp, i64, cp, ctypes.POINTER(vp)]),
        "ckpt_save_wait": (i32, [vp, i32, i32]),
        "ckpt_save_state": (i32, [vp]),
        "ckpt_save_reason": (cp, [vp]),
        "ckpt_save_release": (None, [vp]),
        "ckpt_restore2": (i32, [vp, i64, i32, ctypes.POINTER(i64), ctypes.POINTER(vp)]),
        "ckpt_restore_opts": (i32, [vp, i64, ctypes.POINTER(_RestoreOpts), ctypes.POINTER(i64),
                                    ctypes.POINTER(vp)]),
        "ckpt_strerror": (cp, [i32]),
        "ckpt_last_error": (cp, [vp]),
        "ckpt_state_name": (cp, [i32]),
    }
    # The CUDA transport, in a libckpt built with CUDA (cudaStream_t: a pointer).
    cuda = {
        "ckpt_save_on": (i32, [vp, i64, cp, vp, ctypes.POINTER(vp)]),
        "ckpt_save_fence": (i32, [vp, vp]),
    }
    for name, (res, args) in list(sigs.items()) + list(cuda.items()):
        fn = getattr(lib, name, None)
        if fn is None and name in cuda:
            continue
        fn.restype, fn.argtypes = res, args
    return lib


def has_cuda() -> bool:
    """Whether libckpt was built with the CUDA transport (Plan.save_on, Save.fence)."""
    return hasattr(_l(), "ckpt_save_on")


def _cuda_fn(name):
    if not has_cuda():
        raise Error(_errno.ENOSYS, "%s: this libckpt was built without CUDA (no CUDA "
                    "toolkit where it was built): rebuild it where nvcc is found" % name)
    return getattr(_l(), name)


_lib = None


def _l():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def state_name(state: int) -> str:
    """The name of a save state (QUEUED ... SKIPPED), as the agent says it."""
    return _l().ckpt_state_name(state).decode()


def _check(rc, client=None):
    if rc >= 0:
        return rc
    msg = ""
    if client is not None:
        msg = _l().ckpt_last_error(client).decode(errors="replace")
    if not msg:
        msg = _l().ckpt_strerror(rc).decode(errors="replace")
    raise Error(-rc, msg)


def _c_text(what, text, json_text=False):
    """text as bytes for a C string. ctypes would cut it at a NUL ("a\\0b"
    reaching C as "a"), so NUL and the other control characters (0x00-0x1f,
    0x7f) are refused here, as the agent refuses them; JSON text may hold
    tab, LF and CR."""
    b = text.encode() if isinstance(text, str) else bytes(text)
    for i, ch in enumerate(b):
        if (ch < 0x20 or ch == 0x7f) and not (json_text and ch in (9, 10, 13)):
            shown = "a NUL" if ch == 0 else "control character 0x%02x" % ch
            raise Error(_errno.EINVAL,
                        "%s %r has %s at byte %d: NUL and control characters are "
                        "not allowed, remove it" % (what, text[:64], shown, i))
    return b


class HostMemory:
    """Memory from ckpt_host_alloc: .address, .size, and views into it."""

    def __init__(self, client: "Client", ptr: int, size: int):
        self._client, self.address, self.size = client, ptr, size

    def buffer(self) -> ctypes.Array:
        """All of it, as a ctypes char array (writable, no copy)."""
        return (ctypes.c_char * self.size).from_address(self.address)

    def ndarray(self, dtype: Any, shape: Sequence[int], offset: int = 0) -> Any:
        """A numpy view of `shape` elements of `dtype` at byte `offset` (no copy)."""
        import numpy as np
        dt = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        if offset < 0 or offset + count * dt.itemsize > self.size:
            raise ValueError("view of %d bytes at %d is outside %d bytes of host memory"
                             % (count * dt.itemsize, offset, self.size))
        return np.frombuffer(self.buffer(), dtype=dt, count=count,
                             offset=offset).reshape(shape)

    def free(self) -> None:
        """Gives it back (a plan using it keeps it until the plan is destroyed)."""
        if self.address:
            _l().ckpt_host_free(self._client._c, self.address)
            self.address = 0


class Tensor:
    """A tensor of a plan: a numpy array living in host memory, or raw fields."""

    def __init__(self, name: str, array: Any = None, dtype: Optional[str] = None,
                 shape: Optional[Sequence[int]] = None, address: Optional[int] = None,
                 global_shape: Optional[Sequence[int]] = None,
                 global_offset: Optional[Sequence[int]] = None):
        """`array`: a C-contiguous numpy array in ckpt host memory; else `dtype`
        (a safetensors name: "F32", "BF16", ...), `shape` and `address`.
        A sharded tensor says its `global_shape` and where its box starts
        (`global_offset`); a replicated one the same shape at offset zeros."""
        if array is not None:
            dtype = _NUMPY_DTYPES.get(array.dtype.name)
            if dtype is None:
                raise ValueError("tensor %r: numpy dtype %s has no safetensors name"
                                 % (name, array.dtype))
            if not array.flags["C_CONTIGUOUS"]:
                raise ValueError("tensor %r: the array must be C-contiguous" % name)
            shape, address = array.shape, array.ctypes.data
            self.array = array
        if dtype not in DTYPES:
            raise ValueError("tensor %r: unknown dtype %r" % (name, dtype))
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.address = address
        self.global_shape, self.global_offset = global_shape, global_offset


class Save:
    """A save in flight (Plan.save): its state, waited for."""

    def __init__(self, client: "Client", handle: ctypes.c_void_p):
        self._client, self._s = client, handle

    def wait(self, until: int = CAPTURED, timeout_ms: int = -1) -> None:
        """Until the save reaches `until` (or ends): raises Error if it failed
        or the time ran out (ETIMEDOUT)."""
        _check(_l().ckpt_save_wait(self._s, until, timeout_ms), self._client._c)

    def fence(self, stream: int) -> None:
        """Makes the CUDA stream `stream` (a cudaStream_t, e.g.
        torch.cuda.current_stream().cuda_stream) wait for CAPTURED; the
        host thread does not wait (ckpt_save_fence)."""
        _check(_cuda_fn("ckpt_save_fence")(self._s, stream), self._client._c)

    @property
    def state(self) -> int:
        return _l().ckpt_save_state(self._s)

    @property
    def reason(self) -> str:
        """Why it failed or was skipped, or a note ("" if none)."""
        return _l().ckpt_save_reason(self._s).decode(errors="replace")

    def release(self) -> None:
        if self._s:
            _l().ckpt_save_release(self._s)
            self._s = None

    def __del__(self):
        self.release()


class Plan:
    """A rank's tensors, declared once (Client.plan); saved and restored by step."""

    def __init__(self, client: "Client", handle: ctypes.c_void_p, tensors: Sequence[Tensor]):
        self._client, self._p, self._tensors = client, handle, tensors
        self.skipped: List[str] = []  # the last restore's notes (steps passed over, ...)

    @property
    def bytes(self) -> int:
        """The size of this rank's shard file (header included)."""
        return _l().ckpt_plan_bytes(self._p)

    def save(self, step: int, meta: Any = None) -> Save:
        """Queues a save of `step` (meta: JSON text, or a value json.dumps takes);
        returns at once: wait for CAPTURED before writing the tensors again."""
        if meta is not None and not isinstance(meta, str):
            meta = json.dumps(meta)
        out = ctypes.c_void_p()
        _check(_l().ckpt_save(self._p, step, _c_text("meta", meta, True) if meta else None,
                              ctypes.byref(out)), self._client._c)
        return Save(self._client, out)

    def save_on(self, step: int, meta: Any, stream: int) -> Save:
        """Plan.save for a plan of CUDA tensors, the agent's copies ordered
        after the work queued on `stream` (a cudaStream_t; 0: the default
        stream); nothing waits on the host (ckpt_save_on)."""
        if meta is not None and not isinstance(meta, str):
            meta = json.dumps(meta)
        out = ctypes.c_void_p()
        _check(_cuda_fn("ckpt_save_on")(self._p, step,
                                         _c_text("meta", meta, True) if meta else None,
                                         stream, ctypes.byref(out)), self._client._c)
        return Save(self._client, out)

    def restore(self, step: int = LATEST, fallback: bool = False,
                strict: bool = False) -> Tuple[int, Any]:
        """Restores `step` (LATEST: the newest committed) into the tensors, in
        place. Returns (the step restored, this rank's meta as a Python value
        or None).

        Raises NoCheckpoint (ENOENT) where there is no such checkpoint (the
        one answer that means a fresh start), DamagedCheckpoint (EBADMSG)
        where a committed one cannot be read whole, Error otherwise (EIO:
        the storage failed). With LATEST a damaged newest step is passed
        over for the newest one that restores whole, with a PassedOver
        warning naming it (self.skipped: the notes); strict: never, its
        error instead; fallback: past any failure, an I/O error too."""
        got, meta = ctypes.c_int64(-1), ctypes.c_void_p()
        opts = _RestoreOpts(ctypes.sizeof(_RestoreOpts),
                            FALLBACK_NEVER if strict else
                            FALLBACK_ANY if fallback else FALLBACK_DAMAGED, 0, None)
        rc = _l().ckpt_restore_opts(self._p, step, ctypes.byref(opts), ctypes.byref(got),
                                    ctypes.byref(meta))
        self.skipped = []
        if opts.skipped:
            self.skipped = ctypes.string_at(opts.skipped).decode(errors="replace").splitlines()
            ctypes.CDLL(None).free(ctypes.c_void_p(opts.skipped))
        try:
            _check(rc, self._client._c)
        except Error as e:
            kind = {_errno.ENOENT: NoCheckpoint, _errno.EBADMSG: DamagedCheckpoint}.get(e.errno)
            if kind:
                raise kind(e.errno, e.strerror) from None
            raise
        # passed over: notes of other steps than the one restored ("step N: why")
        passed = [n for n in self.skipped
                  if re.match(r"step (\d+)", n) and
                  int(re.match(r"step (\d+)", n).group(1)) != got.value]
        if passed:
            import warnings
            warnings.warn("step %d restored; newer steps passed over: %s"
                          % (got.value, "; ".join(passed)), PassedOver, stacklevel=2)
        text = None
        if meta.value:
            text = ctypes.string_at(meta.value).decode()
            ctypes.CDLL(None).free(meta)
        return got.value, json.loads(text) if text else None

    def destroy(self) -> None:
        if self._p:
            _l().ckpt_plan_destroy(self._p)
            self._p = None


class Client:
    """A connection to ckptd (endpoint None: $CKPT_ENDPOINT, else the default socket)."""

    def __init__(self, endpoint: Optional[str] = None):
        self._c = ctypes.c_void_p()
        _check(_l().ckpt_connect(_c_text("endpoint", endpoint) if endpoint else None,
                                 ctypes.byref(self._c)))

    def host_alloc(self, nbytes: int) -> HostMemory:
        """Host memory shared with the agent: tensors in it are saved without a copy
        in the trainer."""
        ptr = ctypes.c_void_p()
        _check(_l().ckpt_host_alloc(self._c, nbytes, ctypes.byref(ptr)), self._c)
        return HostMemory(self, ptr.value, nbytes)

    def plan(self, job: str, rank: int, world: int, tensors: Sequence[Tensor],
             backpressure: int = 0, run: Optional[str] = None, copies: int = 0) -> Plan:
        """A plan of `tensors` for rank `rank` of `world`. run: this incarnation
        of the job (None: $CKPT_RUN, else "0"). copies: how many ranks write
        each box several ranks hold (0: one; COPIES_ALL: every replica)."""
        arr = (_Tensor * len(tensors))()
        keep = []
        for i, t in enumerate(tensors):
            shape = (ctypes.c_int64 * max(len(t.shape), 1))(*t.shape)
            keep.append(shape)
            gs = go = None
            if t.global_shape is not None:
                gs = (ctypes.c_int64 * max(len(t.global_shape), 1))(*t.global_shape)
                go = (ctypes.c_int64 * max(len(t.global_offset or ()), 1))(
                    *(t.global_offset or ()))
                keep += [gs, go]
            name = _c_text("tensor name", t.name)
            keep.append(name)
            # (a 0-d tensor's global shape is an empty array: falsy, yet given)
            arr[i] = _Tensor(name, DTYPES[t.dtype], len(t.shape), shape, t.address,
                             ctypes.cast(gs, ctypes.POINTER(ctypes.c_int64))
                             if gs is not None else None,
                             ctypes.cast(go, ctypes.POINTER(ctypes.c_int64))
                             if go is not None else None)
        out = ctypes.c_void_p()
        opts = _PlanOpts(ctypes.sizeof(_PlanOpts), backpressure,
                         _c_text("run name", run) if run else None, copies)
        job_b = _c_text("job name", job)
        _check(_l().ckpt_plan_create_opts(self._c, job_b, rank, world, arr, len(tensors),
                                          ctypes.byref(opts), ctypes.byref(out)), self._c)
        return Plan(self, out, tensors)

    @property
    def last_error(self) -> str:
        return _l().ckpt_last_error(self._c).decode(errors="replace")

    @property
    def agent_version(self) -> str:
        """The release of the agent attached to (after a restart, the new one's)."""
        return _l().ckpt_agent_version(self._c).decode(errors="replace")

    def close(self) -> None:
        if self._c:
            _l().ckpt_disconnect(self._c)
            self._c = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

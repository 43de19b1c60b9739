"""ckpt.dcp: torch.distributed.checkpoint (DCP) saving to and loading from ckptd.

DCP users keep their code and give it these storage classes:

    import torch.distributed.checkpoint as dcp
    from ckpt.dcp import StorageReader, StorageWriter
    dcp.save(sd, storage_writer=StorageWriter("my-job"), checkpoint_id=step)
    dcp.async_save(sd, storage_writer=StorageWriter("my-job"), checkpoint_id=step)
    dcp.load(sd, storage_reader=StorageReader("my-job"), checkpoint_id=step)

checkpoint_id is the step (an int, or a string of digits); None at load:
the newest committed step. DCP keeps what it does: planning (which rank
writes each replicated tensor, how a state dict is flattened), staging for
async_save, and the load planner's resharding. ckptd adds what it does
beyond a filesystem: every rank's items become a rank's shard in the
agent's layout, with checksums; the checkpoint commits atomically once
every rank's shard is durable (on the shared root, across nodes), so a
torn or half-written step is never loaded; ckptctl and the metrics show
it; retention, the upload tier and verify apply as to any checkpoint.

Each tensor item is saved as its box of the global tensor (its fqn as the
tensor name, DCP's chunk offsets and sizes as the box); a read item is
restored as the box it asks for, assembled by the agent from the chunks
that overlap it. Bytes items (DCP pickles non-tensor values) are U8
tensors. The coordinator saves its shard in finish(), with DCP's metadata
as JSON (tensor "dcp.metadata", its length in "dcp.metadata.len"), so the
step commits only after every rank has written and the metadata exists:
the other ranks' write_data returns once their shard is DURABLE, the
coordinator's finish once the step is COMMITTED. Nothing is unpickled but
what DCP itself unpickles (its bytes items).

The rank is DCP's; the world is the size of the process group given to
the constructor (None: the default group; 1 without torch.distributed).
use_collectives=False is refused: the step commits once, from the
coordinator. Each save and each read uses an agent session of its own,
closed when it is done (DCP never closes a storage writer or reader).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import io
import json
import struct
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.distributed.checkpoint import (BytesStorageMetadata, ChunkStorageMetadata,
                                          Metadata, StorageReader as _Reader,
                                          StorageWriter as _Writer, TensorStorageMetadata)
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from . import COMMITTED, DURABLE, LATEST, Client, Error, Tensor as _CTensor
from .torch import _DTYPES, _TORCH_DTYPES, _Region, _nbytes, _packed, _view

__all__ = ["StorageReader", "StorageWriter"]

_MD, _MD_LEN = "dcp.metadata", "dcp.metadata.len"


def _step_of(checkpoint_id: Any, what: str) -> int:
    if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool) and \
            checkpoint_id >= 0:
        return checkpoint_id
    if isinstance(checkpoint_id, str) and checkpoint_id.isdigit():
        return int(checkpoint_id)
    raise Error(_errno.EINVAL, "%s: checkpoint_id %r is not a step: give the step number "
                "(an int >= 0, or a string of digits)" % (what, checkpoint_id))


def _world(group: Any) -> int:
    """The process group's size (the default group's; 1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _rank(group: Any) -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


class _Shard:
    """One rank's items, copied into ckpt host memory (one region) when saved."""

    def __init__(self):
        self.items = []

    def add(self, name: str, data: torch.Tensor, gshape=None, goff=None) -> None:
        """A tensor item (its box of the global tensor), or, without a box,
        a whole one: saved as a box at zeros of its own shape, so that any
        number of ranks may read it at once (the agent lets one name be on
        several ranks' plans only as boxes of one global tensor)."""
        data = data.detach()
        if gshape is None:
            gshape, goff = list(data.shape), [0] * data.dim()
        if data.dtype not in _DTYPES:
            raise Error(_errno.EINVAL, "%s: dtype %s cannot be saved through ckptd"
                        % (name, data.dtype))
        if data.device.type != "cpu":
            data = data.cpu()
        self.items.append((name, data, gshape, goff))

    def save(self, endpoint: Optional[str], job: str, rank: int, world: int, step: int,
             until: int) -> None:
        """Saves the items as `step` of rank of world and waits for `until`,
        through a session of its own (DCP never closes a storage writer)."""
        with Client(endpoint) as client:
            self._save(client, job, rank, world, step, until)

    def _save(self, client: Client, job: str, rank: int, world: int, step: int,
              until: int) -> None:
        offsets, total = _packed(_nbytes(t) for _, t, _, _ in self.items)
        region = _Region(client, total)
        try:
            tensors = []
            for (name, t, gs, go), off in zip(self.items, offsets):
                _view(region.buf, off, t.dtype, tuple(t.shape)).copy_(t)
                tensors.append(_CTensor(name, dtype=_DTYPES[t.dtype], shape=tuple(t.shape),
                                        address=region.start + off, global_shape=gs,
                                        global_offset=go))
            self.items = []
            plan = client.plan(job, rank, world, tensors)
            try:
                s = plan.save(step, {"dcp": True})
                try:
                    s.wait(until)
                except Error as e:
                    raise Error(e.errno, "job %s step %d rank %d: %s"
                                % (job, step, rank, s.reason or e.strerror)) from None
                finally:
                    s.release()
            finally:
                plan.destroy()
        finally:
            region.free()


class StorageWriter(_Writer):
    """DCP's storage writer over ckptd (job `job`, endpoint None:
    $CKPT_ENDPOINT); the step is the checkpoint_id (or `step`).
    process_group: the one given to dcp.save (None: the default group);
    its size is the checkpoint's world, DCP's rank this rank's. Each save
    talks to the agent through a session of its own, closed when done."""

    def __init__(self, job: str, step: Optional[int] = None, endpoint: Optional[str] = None,
                 process_group: Any = None):
        super().__init__()
        self.job, self.step, self.endpoint = job, step, endpoint
        self.group = process_group
        self._shard: Optional[_Shard] = None
        self._coordinator, self._rank = False, 0

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self.step = _step_of(checkpoint_id, "ckpt.dcp.StorageWriter")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            _step_of(checkpoint_id, "")
            return True
        except Error:
            return False

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.step is None:
            raise Error(_errno.EINVAL, "ckpt.dcp.StorageWriter: no step: give checkpoint_id="
                        "STEP to dcp.save, or step= here")
        if kwargs.get("use_collectives") is False:
            raise Error(_errno.EINVAL, "ckpt.dcp.StorageWriter: use_collectives=False: every "
                        "rank would finish() on its own; ckptd commits a step once, when the "
                        "coordinator has every rank's results")
        self._coordinator = is_coordinator
        self._rank = kwargs.get("rank", _rank(self.group))

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner) -> Future:
        shard = _Shard()
        results = []
        for item in plan.items:
            data = planner.resolve_data(item)
            name = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                shard.add(name, torch.frombuffer(bytearray(raw) or bytearray(1),
                                                 dtype=torch.uint8)[:len(raw)])
                results.append(WriteResult(item.index, len(raw), {"bytes": len(raw)}))
                continue
            td = item.tensor_data
            t = data.detach().contiguous()
            shard.add(name, t, list(td.size), list(td.chunk.offsets))
            results.append(WriteResult(item.index, _nbytes(t), None))
        if self._coordinator:
            self._shard = shard  # saved in finish(), with the metadata
        else:
            shard.save(self.endpoint, self.job, self._rank, _world(self.group), self.step,
                       DURABLE)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        nbytes = {r.index.fqn: r.storage_data["bytes"] for rs in results for r in rs
                  if isinstance(r.storage_data, dict) and "bytes" in r.storage_data}
        text = json.dumps(_metadata_json(metadata, nbytes), separators=(",", ":")).encode()
        shard, self._shard = self._shard or _Shard(), None
        shard.add(_MD_LEN, torch.tensor([len(text)], dtype=torch.int64))
        shard.add(_MD, torch.frombuffer(bytearray(text), dtype=torch.uint8))
        shard.save(self.endpoint, self.job, self._rank, _world(self.group), self.step,
                   COMMITTED)

    def storage_meta(self):
        return None


def _metadata_json(md: Metadata, nbytes: Dict[str, int]) -> Dict[str, Any]:
    sd: Dict[str, Any] = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            sd[fqn] = {"b": nbytes.get(fqn, 0)}
        else:
            sd[fqn] = {"t": _DTYPES[m.properties.dtype], "size": list(m.size),
                       "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks]}
    planner = None
    if isinstance(md.planner_data, dict) and all(
            isinstance(v, (tuple, list)) and all(isinstance(k, (str, int)) for k in v)
            for v in md.planner_data.values()):
        planner = {k: list(v) for k, v in md.planner_data.items()}
    return {"ckpt.dcp": 1, "sd": sd, "planner": planner}


def _dims(v: Any, ndim: Optional[int] = None) -> torch.Size:
    """A list of dimensions (non-negative ints below 2^62), of ndim of them if given."""
    if not isinstance(v, list) or (ndim is not None and len(v) != ndim) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in v):
        raise ValueError("%.60r is not a list of %s dimensions" % (v, ndim or "any"))
    return torch.Size(v)


def _metadata_from(doc: Any, where: str) -> Metadata:
    """DCP's Metadata from the JSON saved by finish(), checked as input."""
    def bad(why):
        return Error(_errno.EBADMSG, "%s: %s is not ckpt.dcp metadata: %s" % (where, _MD, why))
    if not isinstance(doc, dict) or type(doc.get("ckpt.dcp")) is not int or \
            doc["ckpt.dcp"] != 1 or not isinstance(doc.get("sd"), dict):
        raise bad("no version 1")
    sd: Dict[str, Any] = {}
    nbytes: Dict[str, int] = {}
    for fqn, m in doc["sd"].items():
        try:
            if not isinstance(m, dict):
                raise ValueError("not an object")
            if "b" in m:
                sd[fqn] = BytesStorageMetadata()
                nbytes[fqn] = _dims([m["b"]], 1)[0]
                continue
            size = _dims(m["size"])
            chunks = []
            for c in m["chunks"]:
                if not isinstance(c, list) or len(c) != 2:
                    raise ValueError("a chunk is not [offsets, sizes]")
                off, sz = _dims(c[0], len(size)), _dims(c[1], len(size))
                if any(o + n > d for o, n, d in zip(off, sz, size)):
                    raise ValueError("chunk %s+%s is outside %s" % (list(off), list(sz),
                                                                    list(size)))
                chunks.append(ChunkStorageMetadata(offsets=off, sizes=sz))
            sd[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_TORCH_DTYPES[m["t"]]),
                size=size, chunks=chunks)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise bad("entry %r: %s" % (fqn, e)) from None
    planner = doc.get("planner")
    if planner is not None:
        if not isinstance(planner, dict) or not all(
                isinstance(v, list) and all(isinstance(k, (str, int)) for k in v)
                for v in planner.values()):
            raise bad("planner data that is not {fqn: [keys]}")
        planner = {k: tuple(v) for k, v in planner.items()}
    return Metadata(state_dict_metadata=sd, planner_data=planner, storage_data=nbytes)


class StorageReader(_Reader):
    """DCP's storage reader over ckptd (job `job`, endpoint None:
    $CKPT_ENDPOINT); the step is the checkpoint_id (None: the newest
    committed, found by each rank's first read: a step committed while
    ranks load may split them, so name the step where that can happen).
    process_group as for StorageWriter."""

    def __init__(self, job: str, step: Optional[int] = None, endpoint: Optional[str] = None,
                 process_group: Any = None):
        super().__init__()
        self.job, self.endpoint, self.group = job, endpoint, process_group
        self._asked = LATEST if step is None else step
        self.step = self._asked  # the step being read, once LATEST is found
        self._rank = _rank(process_group)
        self._nbytes: Dict[str, int] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self._asked = _step_of(checkpoint_id, "ckpt.dcp.StorageReader")
        self.step = self._asked

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return StorageWriter.validate_checkpoint_id(checkpoint_id)

    def _restore(self, items: List[Tuple[str, torch.Tensor, Any, Any]]) -> None:
        """Restores (name, host tensor, global shape, offset) of self.step."""
        with Client(self.endpoint) as client:  # DCP never closes a reader
            self._restore_with(client, items)

    def _restore_with(self, client: Client, items: List[Tuple[str, torch.Tensor, Any, Any]]):
        offsets, total = _packed(_nbytes(t) for _, t, _, _ in items)
        region = _Region(client, total)
        try:
            views, tensors = [], []
            for (name, t, gs, go), off in zip(items, offsets):
                tensors.append(_CTensor(name, dtype=_DTYPES[t.dtype], shape=tuple(t.shape),
                                        address=region.start + off, global_shape=gs,
                                        global_offset=go))
                views.append(_view(region.buf, off, t.dtype, tuple(t.shape)))
            plan = client.plan(self.job, self._rank, _world(self.group), tensors)
            try:
                got, _ = plan.restore(self.step)
            finally:
                plan.destroy()
            self.step = got  # LATEST becomes the step it was, for the reads after
            for (_, t, _, _), v in zip(items, views):
                t.copy_(v)
        finally:
            region.free()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._rank = kwargs.get("rank", self._rank)
        self.step = self._asked  # a load begins here: LATEST is found again
        n = torch.zeros(1, dtype=torch.int64)
        self._restore([(_MD_LEN, n, [1], [0])])
        if not 0 < int(n) <= 1 << 30:
            raise Error(_errno.EBADMSG, "job %s step %d: %s says %d bytes"
                        % (self.job, self.step, _MD_LEN, int(n)))
        text = torch.empty(int(n), dtype=torch.uint8)
        self._restore([(_MD, text, [int(n)], [0])])
        where = "job %s step %d" % (self.job, self.step)
        try:
            doc = json.loads(ctypes.string_at(text.data_ptr(), text.numel()))
        except ValueError as e:
            raise Error(_errno.EBADMSG, "%s: %s is not JSON: %s" % (where, _MD, e)) from None
        md = _metadata_from(doc, where)
        self._nbytes = md.storage_data
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._rank = kwargs.get("rank", self._rank)
        self._nbytes = metadata.storage_data or {}

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner) -> Future:
        # Items restored together must have distinct names: one batch per
        # repeat of a name (one box each), in as few restores as that allows.
        batches: List[List[Any]] = []
        for item in plan.items:
            name = item.storage_index.fqn
            for b in batches:
                if all(i.storage_index.fqn != name for i in b):
                    b.append(item)
                    break
            else:
                batches.append([item])
        for batch in batches:
            todo = []
            for item in batch:
                name = item.storage_index.fqn
                if item.type == LoadItemType.BYTE_IO:
                    n = self._nbytes.get(name)
                    if n is None:
                        raise Error(_errno.EBADMSG, "job %s step %d: no length for the bytes "
                                    "item %r" % (self.job, self.step, name))
                    todo.append((item, name, torch.empty(n, dtype=torch.uint8), [n], [0]))
                    continue
                chunk = item.storage_index.offset
                box = [c + s for c, s in zip(chunk, item.storage_offsets)]
                md = planner.metadata.state_dict_metadata[name]
                todo.append((item, name, torch.empty(tuple(item.lengths),
                                                     dtype=md.properties.dtype),
                             list(md.size), box))
            self._restore([(name, t, gs, go) for _, name, t, gs, go in todo])
            for item, name, t, _, _ in todo:
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(ctypes.string_at(t.data_ptr(), t.numel())))
                    continue
                target = planner.resolve_tensor(item).detach()  # already the item's box
                if tuple(target.shape) != tuple(t.shape):
                    raise Error(_errno.EINVAL, "%s: the planner's target has shape %s, the "
                                "item %s" % (name, tuple(target.shape), tuple(t.shape)))
                target.copy_(t)
                planner.commit_tensor(item, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

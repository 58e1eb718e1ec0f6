"""``Communicator``: one rank of a world, its collectives and point-to-point calls.

Making a world (every rank does the same, with its own rank):

- ``Communicator(uid, rank, size)`` with a ``UniqueId`` made by one process
  (``UniqueId.create()``) and handed to the others (``uid.to_bytes()`` / ``UniqueId.from_bytes``);
- ``Communicator.from_address("10.0.0.1:29600", rank, size, secret=...)``: a plain root
  address, authenticated by a shared passphrase;
- ``Communicator.from_env()``: the launcher's variables, as the Rust side reads them
  (``MSCCLPP_RANK``/``MSCCLPP_WORLD_SIZE``, torchrun's ``RANK``/``WORLD_SIZE`` with
  ``MASTER_ADDR``/``MASTER_PORT``, Open MPI's, Slurm's; the root from ``MSCCLPP_UNIQUE_ID``,
  ``MSCCLPP_BOOTSTRAP`` or ``MASTER_ADDR``);
- ``Communicator.from_torch(group)``: the ranks of a ``torch.distributed`` process group (rank
  0 makes the id, the group broadcasts it).

Calls (every rank makes the same collective calls in the same order, as with NCCL):

======================================================  ==================================
call                                                    NCCL
======================================================  ==================================
``all_reduce(tensor, op, output=None)``                 ``ncclAllReduce`` (in place unless
                                                        ``output``)
``all_gather(output, input)``                           ``ncclAllGather``
``reduce_scatter(output, input, op)``                   ``ncclReduceScatter``
``broadcast(tensor, root, output=None)``                ``ncclBroadcast``
``reduce(tensor, root, op, output=None)``               ``ncclReduce``
``all_to_all(output, input)``                           ``ncclAllToAll``
``all_to_allv(output, input, sends, recvs)``            grouped sends and receives
``gather(input, output, root)`` / ``scatter(...)``      ``ncclGather`` / ``ncclScatter``
``send(tensor, peer)`` / ``recv(tensor, peer)``         ``ncclSend`` / ``ncclRecv``
``send_recv(send, next, recv, prev)``                   a grouped send and receive
``with comm.group(): ...``                              ``ncclGroupStart`` / ``ncclGroupEnd``
``split(color, key)``                                   ``ncclCommSplit``
``register_buffer(a)``, ``register_window(a)``          ``ncclCommRegister``, window
                                                        registration
``mem_alloc(shape, dtype)``                             ``ncclMemAlloc``
======================================================  ==================================

**Streams.** ``stream=None`` with CUDA data from PyTorch or CuPy queues on that framework's
current stream and returns at once (as NCCL does). With other data (NumPy, ``DeviceArray``,
CPU tensors) it runs on the communicator's own stream and the call returns when the work is
done, raising a device wait's error (a timeout, a receive of the wrong count). A ``stream``
argument (an integer ``CUstream``, a ``torch.cuda.Stream``, a CuPy stream, or
``Communicator.stream()``) queues there and returns at once; ``check()`` reports what went
wrong later. Every wait releases the GIL, so ranks may be threads of one process
(``run_ranks``).

>>> import numpy as np
>>> from mscclpp_rs import run_ranks
>>> def rank(comm):
...     x = np.arange(4, dtype=np.float32) + 10 * comm.rank
...     comm.all_reduce(x)                       # in place, summed over the ranks
...     out = np.zeros(2 * 4, np.float32)
...     comm.all_gather(out, x)                  # every rank's x, in rank order
...     return x.tolist(), out[:4].tolist()
>>> run_ranks(2, rank)[0]
([10.0, 12.0, 14.0, 16.0], [10.0, 12.0, 14.0, 16.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _native
from ._native import Connection, Memory, PortChannelService
from .arrays import BufferInfo, DeviceArray, Shape, resolve
from .dtypes import DType, dtype_of
from .errors import InvalidArgumentError, InvalidUsageError
from .ops import ReduceOp, Reduction, reduction

__all__ = ["Communicator", "Group", "Registration", "Stream", "Topology", "UniqueId"]

UniqueId = _native.UniqueId
Stream = _native.Stream


@dataclass(frozen=True)
class Topology:
    """The node layout every rank shares: ranks grouped by host identity (``MSCCLPP_HOSTID``,
    or the ``host_id`` a rank was made with), nodes numbered in order of their lowest rank."""

    rank: int
    node_of: Tuple[int, ...]
    """The node of every rank."""
    local_index_of: Tuple[int, ...]
    """Every rank's index among the ranks of its node."""

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return max(self.node_of) + 1

    @property
    def node(self) -> int:
        """This rank's node."""
        return self.node_of[self.rank]

    @property
    def local_rank(self) -> int:
        """This rank's index on its node."""
        return self.local_index_of[self.rank]

    def ranks_on(self, node: int) -> Tuple[int, ...]:
        """The ranks of ``node``, in rank order."""
        return tuple(r for r, n in enumerate(self.node_of) if n == node)

    @property
    def local_ranks(self) -> Tuple[int, ...]:
        """The ranks of this rank's node."""
        return self.ranks_on(self.node)


def stream_handle(stream: Any) -> int:
    """The integer a stream is named by: an ``int``; this package's ``Stream``; a
    ``torch.cuda.Stream`` (``cuda_stream``); a CuPy stream (``ptr``); a Numba stream
    (``handle``)."""
    if isinstance(stream, bool):
        raise InvalidArgumentError("a stream is not a bool")
    if isinstance(stream, int):
        return stream
    for attr in ("handle", "cuda_stream", "ptr"):
        if hasattr(stream, attr):
            value = getattr(stream, attr)
            if hasattr(value, "value"):  # a ctypes c_void_p (Numba); None: the default stream
                value = value.value or 0
            if isinstance(value, int):
                return value
    raise InvalidArgumentError(f"{stream!r} is not a stream (an int, or a stream object)")


class Registration:
    """A buffer registered with every peer (``Communicator.register_buffer``) or a window
    (``register_window``). Keeps its array alive until ``deregister``; a context manager."""

    def __init__(self, comm: Communicator, native: _native.Registration, owner: Any) -> None:
        self._comm: Optional[Communicator] = comm
        self._native = native
        self._owner = owner

    @property
    def ptr(self) -> int:
        """The registered range's first byte."""
        return self._native.ptr

    @property
    def nbytes(self) -> int:
        """Its length."""
        return self._native.nbytes

    @property
    def is_window(self) -> bool:
        """Whether it is a window (registered collectively)."""
        return self._native.is_window

    def deregister(self) -> None:
        """Takes the registration back (a window's: collectively, in the same order on every
        rank). No queued work may still use it. A second call does nothing."""
        comm, self._comm = self._comm, None
        if comm is None:
            return
        coll = comm._collectives()
        if self._native.is_window:
            coll.deregister_window(self._native)
        else:
            coll.deregister(self._native)
        self._owner = None

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.deregister()

    def __repr__(self) -> str:
        return repr(self._native)


class Group:
    """Calls recorded together and queued at the end (NCCL's group): its collectives in order,
    then every send and receive together, so any pattern of pairs works without deadlock.
    ``with comm.group() as g:`` ends it when the block ends without an exception."""

    def __init__(self, comm: Communicator, stream: Any = None) -> None:
        self._comm = comm
        self._stream = stream
        self._ops: List[_native.Op] = []
        self._bufs: List[Optional[BufferInfo]] = []
        self._ended = False

    def _add(self, built: Tuple[_native.Op, List[Optional[BufferInfo]]]) -> None:
        if self._ended:
            raise InvalidUsageError("the group has ended")
        op, bufs = built
        self._ops.append(op)
        self._bufs.extend(bufs)

    def all_reduce(
        self, tensor: Any, op: Reduction = ReduceOp.SUM, *, output: Any = None,
        algorithm: Optional[str] = None,
    ) -> None:
        """Records ``Communicator.all_reduce``."""
        self._add(self._comm._all_reduce(tensor, op, output, algorithm))

    def all_gather(self, output: Any, input: Any, *, algorithm: Optional[str] = None) -> None:
        """Records ``Communicator.all_gather``."""
        self._add(self._comm._all_gather(output, input, algorithm))

    def reduce_scatter(
        self, output: Any, input: Any, op: Reduction = ReduceOp.SUM, *,
        algorithm: Optional[str] = None,
    ) -> None:
        """Records ``Communicator.reduce_scatter``."""
        self._add(self._comm._reduce_scatter(output, input, op, algorithm))

    def broadcast(
        self, tensor: Any, root: int, *, output: Any = None, algorithm: Optional[str] = None
    ) -> None:
        """Records ``Communicator.broadcast``."""
        self._add(self._comm._broadcast(tensor, root, output, algorithm))

    def reduce(
        self, tensor: Any, root: int, op: Reduction = ReduceOp.SUM, *, output: Any = None,
        algorithm: Optional[str] = None,
    ) -> None:
        """Records ``Communicator.reduce``."""
        self._add(self._comm._reduce(tensor, root, op, output, algorithm))

    def all_to_all(self, output: Any, input: Any, *, algorithm: Optional[str] = None) -> None:
        """Records ``Communicator.all_to_all``."""
        self._add(self._comm._all_to_all(output, input, algorithm))

    def all_to_allv(
        self, output: Any, input: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
        send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None,
    ) -> None:
        """Records ``Communicator.all_to_allv``."""
        self._add(
            self._comm._all_to_allv(output, input, send_counts, recv_counts, send_displs,
                                    recv_displs)
        )

    def gather(self, input: Any, output: Any = None, root: int = 0) -> None:
        """Records ``Communicator.gather``."""
        self._add(self._comm._gather(input, output, root))

    def scatter(self, output: Any, input: Any = None, root: int = 0) -> None:
        """Records ``Communicator.scatter``."""
        self._add(self._comm._scatter(output, input, root))

    def send(self, tensor: Any, peer: int) -> None:
        """Records a send of ``tensor`` to ``peer`` (this rank included)."""
        self._add(self._comm._send(tensor, peer, allow_self=True))

    def recv(self, tensor: Any, peer: int) -> None:
        """Records a receive into ``tensor`` from ``peer`` (this rank included)."""
        self._add(self._comm._recv(tensor, peer, allow_self=True))

    def end(self) -> None:
        """Queues the group (once)."""
        if self._ended:
            raise InvalidUsageError("the group has ended")
        self._ended = True
        handle = self._comm._stream_for(self._stream, self._bufs)
        self._comm._collectives().run_group(self._ops, handle)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, exc_type: Optional[type], *rest: object) -> None:
        if exc_type is None and not self._ended:
            self.end()


def _join_via(
    exchange: Callable[[Optional[bytes]], bytes],
    rank: int,
    size: int,
    addr: Optional[str],
    **kwargs: Any,
) -> Communicator:
    """Rank 0 makes a unique id, ``exchange`` hands its bytes to every rank (it gets rank 0's
    bytes on rank 0 and ``None`` elsewhere, and returns rank 0's bytes everywhere), then every
    rank joins."""
    uid = UniqueId.create(addr) if rank == 0 else None
    data = exchange(uid.to_bytes() if uid is not None else None)
    if uid is None:
        uid = UniqueId.from_bytes(data)
    return Communicator(uid, rank, size, **kwargs)


class Communicator:
    """One rank of a world with its collectives (module docs). ``collectives=False`` makes a
    communicator for channels only (no collective set-up); ``settings`` overrides collective
    settings as their ``MSCCLPP_*`` variables would (the same on every rank)."""

    def __init__(
        self,
        uid: UniqueId,
        rank: int,
        size: int,
        *,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        host_id: Optional[str] = None,
        collectives: bool = True,
        settings: Optional[Mapping[str, int]] = None,
    ) -> None:
        native = _native.Comm.init(
            uid, rank, size, device=device, backend=backend, timeout_ms=_ms(timeout),
            host_id=host_id,
        )
        self._attach(native, collectives, settings)

    def _attach(
        self, native: _native.Comm, collectives: bool, settings: Optional[Mapping[str, int]]
    ) -> None:
        self._comm: Optional[_native.Comm] = native
        self._settings = dict(settings) if settings else None
        self._coll: Optional[_native.Collectives] = (
            _native.Collectives(native, self._settings) if collectives else None
        )
        self._mem: Dict[int, Registration] = {}

    @classmethod
    def _wrap(
        cls, native: _native.Comm, collectives: bool, settings: Optional[Mapping[str, int]]
    ) -> Communicator:
        self = cls.__new__(cls)
        self._attach(native, collectives, settings)
        return self

    @classmethod
    def from_address(
        cls,
        addr: str,
        rank: int,
        size: int,
        *,
        secret: Optional[str] = None,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        host_id: Optional[str] = None,
        collectives: bool = True,
        settings: Optional[Mapping[str, int]] = None,
    ) -> Communicator:
        """Joins the world whose root is ``addr`` (``ip:port``, ``host:port`` or
        ``ifname:ip:port``; rank 0 listens there). ``secret``, the world's passphrase as
        ``MSCCLPP_SECRET`` holds it (the same on every rank, 16 characters or more; 32 random
        bytes as hex, ``secrets.token_hex(32)``, are what to use), authenticates it; without one
        the world is not authenticated, and the library says so on standard error."""
        native = _native.Comm.init_addr(
            addr, rank, size, secret=secret, device=device, backend=backend,
            timeout_ms=_ms(timeout), host_id=host_id,
        )
        return cls._wrap(native, collectives, settings)

    @classmethod
    def from_env(
        cls,
        *,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        collectives: bool = True,
        settings: Optional[Mapping[str, int]] = None,
    ) -> Communicator:
        """Joins the world the launcher's variables describe (module docs); ``env`` replaces
        the process environment. The device defaults to the rank's index on its node modulo
        the devices."""
        native = _native.Comm.from_env(
            device=device, backend=backend, env=dict(env) if env is not None else None
        )
        return cls._wrap(native, collectives, settings)

    @classmethod
    def from_torch(
        cls,
        group: Any = None,
        *,
        addr: Optional[str] = None,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        collectives: bool = True,
        settings: Optional[Mapping[str, int]] = None,
    ) -> Communicator:
        """The ranks of a ``torch.distributed`` process group (``None``: the default group) as
        a world: its rank 0 makes the unique id (root at ``addr``, default: this host's
        address) and the group broadcasts it (the id holds the world's secret: the group's
        own transport carries it). On CUDA the device defaults to PyTorch's current device."""
        import torch
        import torch.distributed as dist

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        if device is None and backend != "cpu" and torch.cuda.is_available():
            device = torch.cuda.current_device()

        def exchange(mine: Optional[bytes]) -> bytes:
            box: List[Optional[bytes]] = [mine]
            dist.broadcast_object_list(box, src=src, group=group)
            got = box[0]
            if not isinstance(got, bytes):
                raise InvalidArgumentError("the process group broadcast no unique id")
            return got

        return _join_via(
            exchange, rank, size, addr, device=device, backend=backend, timeout=timeout,
            collectives=collectives, settings=settings,
        )

    # ---- the world ------------------------------------------------------------------------

    @property
    def native(self) -> _native.Comm:
        """The native communicator (channels take it)."""
        if self._comm is None:
            raise InvalidUsageError("the communicator is closed")
        return self._comm

    def _collectives(self) -> _native.Collectives:
        if self._coll is None:
            raise InvalidUsageError(
                "this communicator has no collectives (it was made with collectives=False, or "
                "closed)"
            )
        return self._coll

    @property
    def rank(self) -> int:
        """This rank."""
        return self.native.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self.native.size

    @property
    def backend(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self.native.backend

    @property
    def device(self) -> int:
        """The device ordinal."""
        return self.native.device

    @property
    def topology(self) -> Topology:
        """The node layout."""
        node_of, local = self.native.layout()
        return Topology(self.rank, tuple(node_of), tuple(local))

    def barrier(self) -> None:
        """Waits until every rank calls it."""
        self.native.barrier()

    def all_gather_bytes(self, data: bytes) -> List[bytes]:
        """Every rank's ``data`` (of equal length), in rank order (the bootstrap's)."""
        return self.native.all_gather_bytes(data)

    def broadcast_bytes(self, root: int, data: bytes = b"") -> bytes:
        """``root``'s ``data`` on every rank (the bootstrap's)."""
        return self.native.broadcast_bytes(root, data)

    def send_bytes(self, peer: int, data: bytes, tag: int = 0) -> None:
        """Sends a small message to ``peer`` under ``tag`` (below 2^32) over the bootstrap."""
        self.native.send_bytes(peer, tag, data)

    def recv_bytes(self, peer: int, tag: int = 0) -> bytes:
        """The next message ``peer`` sent under ``tag``."""
        return self.native.recv_bytes(peer, tag)

    def split(self, color: Optional[int], key: int = 0) -> Optional[Communicator]:
        """NCCL's ``ncclCommSplit`` (every rank calls it): the ranks of one ``color`` form a new
        communicator, ranked by ``key``; ``color=None`` takes part and gets ``None``. The new
        one has collectives (with these settings) if this one has."""
        sub = self.native.split(color, key)
        if sub is None:
            return None
        return Communicator._wrap(sub, self._coll is not None, self._settings)

    def abort(self) -> None:
        """Releases every device wait of this communicator; its later calls fail."""
        self.native.abort()

    def check(self) -> None:
        """Raises the error this rank should see now (a device wait that gave up, a dead peer,
        an abort), if any: how calls queued on a stream report their failures."""
        self.native.check()

    def reset_status(self) -> None:
        """Clears the device error record and the abort flag (after a ``CountMismatchError``,
        to go on). Only while none of this communicator's kernels runs."""
        self.native.reset_status()

    def stream(self) -> Stream:
        """A new stream on this rank's device, for the ``stream`` arguments."""
        return Stream(self.native)

    def synchronize(self) -> None:
        """Waits for the work queued on the communicator's own stream, then raises a device
        wait's error."""
        self._collectives().synchronize()

    def close(self) -> None:
        """Drops the collectives and the communicator (deregisters what ``mem_alloc`` made).
        Also what garbage collection does; later calls raise ``InvalidUsageError``."""
        for reg in list(self._mem.values()):
            reg.deregister()
        self._mem.clear()
        self._coll = None
        self._comm = None

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._comm is None:
            return "Communicator(closed)"
        return f"Communicator(rank {self.rank} of {self.size}, {self.backend} device {self.device})"

    # ---- memory ---------------------------------------------------------------------------

    def empty(self, shape: Shape, dtype: Any) -> DeviceArray:
        """A ``DeviceArray`` on this rank's device (zeroed: the library's memory always is)."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        d = dtype_of(dtype)
        return DeviceArray(_native.Buffer(self.native, math.prod(dims) * d.size), dims, d)

    zeros = empty

    def from_numpy(self, array: Any) -> DeviceArray:
        """A ``DeviceArray`` holding a copy of ``array`` (its shape and type)."""
        import numpy as np

        a = np.asarray(array)
        out = self.empty(a.shape, a.dtype)
        out.copy_from(a)
        return out

    # ---- arguments ------------------------------------------------------------------------

    def _buf(
        self, obj: Any, what: str, count: Optional[int] = None, dtype: Optional[DType] = None,
        write: bool = False,
    ) -> BufferInfo:
        """``obj`` resolved and checked: on this rank's device, of type ``dtype`` and at least
        ``count`` elements when given, writable when ``write``."""
        b = resolve(obj)
        if b.device != self.backend:
            if b.device == "cpu":
                raise InvalidArgumentError(
                    f"{what}: host memory (a NumPy array, a CPU tensor) is not device memory of "
                    "the CUDA backend; pass a CUDA tensor, a CuPy array or a DeviceArray "
                    "(comm.zeros / comm.from_numpy)"
                )
            raise InvalidArgumentError(
                f"{what}: CUDA memory on a communicator of the CPU backend"
            )
        if b.device == "cuda" and b.device_id != self.device:
            raise InvalidArgumentError(
                f"{what}: the array is on CUDA device {b.device_id}, this rank uses device "
                f"{self.device}"
            )
        if dtype is not None and b.dtype != dtype:
            raise InvalidArgumentError(
                f"{what}: elements of {b.dtype.numpy_name}, the call is on {dtype.numpy_name}"
            )
        if count is not None and b.count < count:
            raise InvalidArgumentError(
                f"{what}: {b.count} elements, the call needs {count}"
            )
        if write and b.readonly:
            raise InvalidArgumentError(f"{what}: the array is read-only")
        return b

    def _parts(self, total: BufferInfo, what: str) -> int:
        """Elements per rank of a buffer that holds one part per rank."""
        n = self.size
        if total.count % n:
            raise InvalidArgumentError(
                f"{what}: {total.count} elements do not split into {n} equal parts"
            )
        return total.count // n

    def _scalar(self, scalar: Any, dtype: DType) -> Tuple[Optional[float], Optional[int]]:
        """A pre-multiplied sum's scalar: a number by value, or an array's address."""
        if scalar is None:
            return None, None
        if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
            return float(scalar), None
        b = self._buf(scalar, "PreMulSum scalar", 1, dtype)
        return None, b.ptr

    def _reducing(self, op: Reduction, dtype: DType) -> Tuple[str, Optional[float], Optional[int], Any]:
        name, scalar = reduction(op)
        value, ptr = self._scalar(scalar, dtype)
        return name, value, ptr, scalar if ptr is not None else None

    def _stream_for(self, stream: Any, bufs: Sequence[Optional[BufferInfo]]) -> Optional[int]:
        if stream is not None:
            return stream_handle(stream)
        for b in bufs:
            if b is not None and b.stream is not None:
                return b.stream
        return None

    def _submit(
        self, built: Tuple[_native.Op, List[Optional[BufferInfo]]], stream: Any
    ) -> None:
        op, bufs = built
        self._collectives().run(op, self._stream_for(stream, bufs))

    # ---- the calls' descriptions (shared by the calls and Group) ---------------------------

    def _all_reduce(
        self, tensor: Any, op: Reduction, output: Any, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(tensor, "all_reduce input", write=output is None)
        o = i if output is None else self._buf(output, "all_reduce output", i.count, i.dtype, True)
        name, value, ptr, keep = self._reducing(op, i.dtype)
        native = _native.Op.all_reduce(
            i.ptr, o.ptr, i.count, int(i.dtype), name, value, ptr, algorithm
        )
        return native, [i, o, _kept(keep)]

    def _all_gather(
        self, output: Any, input: Any, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(input, "all_gather input")
        o = self._buf(output, "all_gather output", i.count * self.size, i.dtype, True)
        return _native.Op.all_gather(i.ptr, o.ptr, i.count, int(i.dtype), algorithm), [i, o]

    def _reduce_scatter(
        self, output: Any, input: Any, op: Reduction, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(input, "reduce_scatter input")
        n = self._parts(i, "reduce_scatter input")
        o = self._buf(output, "reduce_scatter output", n, i.dtype, True)
        name, value, ptr, keep = self._reducing(op, i.dtype)
        native = _native.Op.reduce_scatter(
            i.ptr, o.ptr, n, int(i.dtype), name, value, ptr, algorithm
        )
        return native, [i, o, _kept(keep)]

    def _broadcast(
        self, tensor: Any, root: int, output: Any, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(tensor, "broadcast tensor", write=output is None)
        o = i if output is None else self._buf(output, "broadcast output", i.count, i.dtype, True)
        return _native.Op.broadcast(i.ptr, o.ptr, i.count, int(i.dtype), root, algorithm), [i, o]

    def _reduce(
        self, tensor: Any, root: int, op: Reduction, output: Any, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        is_root = self.rank == root
        i = self._buf(tensor, "reduce input", write=is_root and output is None)
        o: Optional[BufferInfo] = None
        if output is not None:
            o = self._buf(output, "reduce output", i.count, i.dtype, True)
        elif is_root:
            o = i
        name, value, ptr, keep = self._reducing(op, i.dtype)
        native = _native.Op.reduce(
            i.ptr, o.ptr if o else 0, i.count, int(i.dtype), name, root, value, ptr, algorithm
        )
        return native, [i, o, _kept(keep)]

    def _all_to_all(
        self, output: Any, input: Any, algorithm: Optional[str]
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(input, "all_to_all input")
        n = self._parts(i, "all_to_all input")
        o = self._buf(output, "all_to_all output", i.count, i.dtype, True)
        return _native.Op.all_to_all(i.ptr, o.ptr, n, int(i.dtype), algorithm), [i, o]

    def _all_to_allv(
        self, output: Any, input: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
        send_displs: Optional[Sequence[int]], recv_displs: Optional[Sequence[int]],
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(input, "all_to_allv input")
        o = self._buf(output, "all_to_allv output", None, i.dtype, True)
        sc, rc = _counts(send_counts, self.size, "send_counts"), _counts(recv_counts, self.size, "recv_counts")
        sd = _counts(send_displs, self.size, "send_displs") if send_displs is not None else _prefix(sc)
        rd = _counts(recv_displs, self.size, "recv_displs") if recv_displs is not None else _prefix(rc)
        for what, counts, displs, buf in (("send", sc, sd, i), ("receive", rc, rd, o)):
            end = max((d + c for c, d in zip(counts, displs)), default=0)
            if end > buf.count:
                raise InvalidArgumentError(
                    f"all_to_allv: the {what} counts and displacements reach element {end}; "
                    f"the buffer holds {buf.count}"
                )
        native = _native.Op.all_to_allv(i.ptr, sc, sd, o.ptr, rc, rd, int(i.dtype))
        return native, [i, o]

    def _gather(
        self, input: Any, output: Any, root: int
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(input, "gather input")
        o: Optional[BufferInfo] = None
        if self.rank == root or output is not None:
            if output is None:
                raise InvalidArgumentError("gather: the root needs an output")
            o = self._buf(output, "gather output", i.count * self.size, i.dtype, True)
        native = _native.Op.gather(i.ptr, o.ptr if o else 0, i.count, int(i.dtype), root)
        return native, [i, o]

    def _scatter(
        self, output: Any, input: Any, root: int
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        o = self._buf(output, "scatter output", write=True)
        i: Optional[BufferInfo] = None
        if self.rank == root or input is not None:
            if input is None:
                raise InvalidArgumentError("scatter: the root needs an input")
            i = self._buf(input, "scatter input", o.count * self.size, o.dtype)
        native = _native.Op.scatter(i.ptr if i else 0, o.ptr, o.count, int(o.dtype), root)
        return native, [i, o]

    def _peer(self, peer: int, allow_self: bool) -> int:
        if not 0 <= peer < self.size:
            raise InvalidArgumentError(f"peer {peer} is not a rank of this world of {self.size}")
        if peer == self.rank and not allow_self:
            raise InvalidArgumentError(
                "a send or receive alone cannot be to this rank itself (use a group)"
            )
        return peer

    def _send(
        self, tensor: Any, peer: int, allow_self: bool = False
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        i = self._buf(tensor, "send tensor")
        return _native.Op.send(i.ptr, i.count, int(i.dtype), self._peer(peer, allow_self)), [i]

    def _recv(
        self, tensor: Any, peer: int, allow_self: bool = False
    ) -> Tuple[_native.Op, List[Optional[BufferInfo]]]:
        o = self._buf(tensor, "recv tensor", write=True)
        return _native.Op.recv(o.ptr, o.count, int(o.dtype), self._peer(peer, allow_self)), [o]

    # ---- the calls ------------------------------------------------------------------------

    def all_reduce(
        self, tensor: Any, op: Reduction = ReduceOp.SUM, *, output: Any = None,
        stream: Any = None, algorithm: Optional[str] = None,
    ) -> None:
        """Reduces ``tensor`` over the ranks by ``op``, in place (into ``output`` if given)."""
        self._submit(self._all_reduce(tensor, op, output, algorithm), stream)

    def all_gather(
        self, output: Any, input: Any, *, stream: Any = None, algorithm: Optional[str] = None
    ) -> None:
        """Every rank's ``input`` lands at ``output[rank * input.size ...]`` on every rank
        (``output`` holds ``size`` times as many elements)."""
        self._submit(self._all_gather(output, input, algorithm), stream)

    def reduce_scatter(
        self, output: Any, input: Any, op: Reduction = ReduceOp.SUM, *, stream: Any = None,
        algorithm: Optional[str] = None,
    ) -> None:
        """Rank r's ``output`` gets the reduction of every rank's part r of ``input`` (which
        holds ``size`` parts as large as ``output``)."""
        self._submit(self._reduce_scatter(output, input, op, algorithm), stream)

    def broadcast(
        self, tensor: Any, root: int, *, output: Any = None, stream: Any = None,
        algorithm: Optional[str] = None,
    ) -> None:
        """``root``'s ``tensor`` into every rank's ``tensor`` (or ``output``)."""
        self._submit(self._broadcast(tensor, root, output, algorithm), stream)

    def reduce(
        self, tensor: Any, root: int, op: Reduction = ReduceOp.SUM, *, output: Any = None,
        stream: Any = None, algorithm: Optional[str] = None,
    ) -> None:
        """The reduction of every rank's ``tensor`` into ``root``'s ``tensor`` (or
        ``output``); other ranks' data is not changed."""
        self._submit(self._reduce(tensor, root, op, output, algorithm), stream)

    def all_to_all(
        self, output: Any, input: Any, *, stream: Any = None, algorithm: Optional[str] = None
    ) -> None:
        """Part p of every rank's ``input`` (``size`` equal parts) lands as part r of rank p's
        ``output``."""
        self._submit(self._all_to_all(output, input, algorithm), stream)

    def all_to_allv(
        self, output: Any, input: Any, send_counts: Sequence[int], recv_counts: Sequence[int],
        send_displs: Optional[Sequence[int]] = None, recv_displs: Optional[Sequence[int]] = None,
        *, stream: Any = None,
    ) -> None:
        """``send_counts[q]`` elements from ``input[send_displs[q]:]`` go to rank q, which
        receives them at ``output[recv_displs[r]:]`` (``recv_counts[r]`` elements). Counts and
        displacements are in elements, one per rank; displacements default to packed parts."""
        built = self._all_to_allv(output, input, send_counts, recv_counts, send_displs, recv_displs)
        self._submit(built, stream)

    def gather(
        self, input: Any, output: Any = None, root: int = 0, *, stream: Any = None
    ) -> None:
        """Every rank's ``input`` lands at ``output[rank * input.size ...]`` on ``root`` (other
        ranks pass no output)."""
        self._submit(self._gather(input, output, root), stream)

    def scatter(
        self, output: Any, input: Any = None, root: int = 0, *, stream: Any = None
    ) -> None:
        """Part r of ``root``'s ``input`` lands in rank r's ``output`` (other ranks pass no
        input)."""
        self._submit(self._scatter(output, input, root), stream)

    def send(self, tensor: Any, peer: int, *, stream: Any = None) -> None:
        """Sends ``tensor`` to ``peer``, which receives it with ``recv`` (pairs match in order;
        a receive of another count raises ``CountMismatchError`` on its rank)."""
        self._submit(self._send(tensor, peer), stream)

    def recv(self, tensor: Any, peer: int, *, stream: Any = None) -> None:
        """Receives ``tensor`` from ``peer``."""
        self._submit(self._recv(tensor, peer), stream)

    def send_recv(
        self, send: Any, next: int, recv: Any, prev: int, *, stream: Any = None
    ) -> None:
        """Sends ``send`` to ``next`` and receives ``recv`` from ``prev``, both at once (any
        pattern of pairs: a ring, ``next == prev``)."""
        i = self._buf(send, "send_recv send")
        o = self._buf(recv, "send_recv recv", i.count, i.dtype, True)
        if o.count != i.count:
            raise InvalidArgumentError(
                f"send_recv: {i.count} elements sent, {o.count} received (they must match)"
            )
        handle = self._stream_for(stream, [i, o])
        self._collectives().send_recv(
            i.ptr, self._peer(next, False), o.ptr, self._peer(prev, False), i.count,
            int(i.dtype), handle,
        )

    def group(self, *, stream: Any = None) -> Group:
        """A ``Group`` (NCCL's ``ncclGroupStart``): ``with comm.group() as g: g.send(...)``."""
        self._collectives()
        return Group(self, stream)

    # ---- registration ---------------------------------------------------------------------

    def register_buffer(self, array: Any) -> Registration:
        """Registers ``array``'s memory with every peer (NCCL's ``ncclCommRegister``; not
        collective), so calls on it exchange nothing per call. The memory must come from an
        exportable allocator (a ``DeviceArray``, PyTorch's CUDA caching allocator, CuPy's) to
        help; other memory is declined, not refused: the registration does nothing and calls
        on it run as on unregistered memory."""
        b = self._buf(array, "register_buffer")
        return Registration(self, self._collectives().register_buffer(b.ptr, b.nbytes), b.owner)

    def register_window(self, array: Any) -> Registration:
        """Registers ``array`` as a window (collective: every rank, a buffer of the same size,
        in the same order)."""
        b = self._buf(array, "register_window")
        return Registration(self, self._collectives().register_window(b.ptr, b.nbytes), b.owner)

    def mem_alloc(self, shape: Shape, dtype: Any) -> DeviceArray:
        """A ``DeviceArray`` registered with every peer (NCCL's ``ncclMemAlloc``); free it with
        ``mem_free`` (or ``close``)."""
        array = self.empty(shape, dtype)
        self._mem[array.ptr] = self.register_buffer(array)
        return array

    def mem_free(self, array: DeviceArray) -> None:
        """Deregisters memory of ``mem_alloc`` (freed when the last reference goes)."""
        reg = self._mem.pop(array.ptr, None)
        if reg is None:
            raise InvalidArgumentError("the array was not made by this communicator's mem_alloc")
        reg.deregister()

    def registrations(self) -> Tuple[int, int]:
        """``(this rank's registrations, the peers' mapped here)``."""
        return self._collectives().registrations()

    # ---- channels (channels.py) ----------------------------------------------------------

    def connect(self, peer: int, tag: int = 0, transport: Optional[str] = None) -> Connection:
        """A connection to ``peer`` (which makes the same call with this rank and ``tag``)."""
        return Connection(self.native, peer, tag, transport)

    def register_memory(self, array: DeviceArray, transport: Optional[str] = None) -> Memory:
        """``array``'s memory registered for ``transport`` (``None``: the same-node one), to
        send to peers."""
        if not isinstance(array, DeviceArray):
            raise InvalidArgumentError(
                "register_memory takes a DeviceArray (comm.zeros / comm.from_numpy)"
            )
        return Memory.register(self.native, array.buffer, transport)

    def send_memory(self, memory: Memory, peer: int, tag: int = 0) -> None:
        """Sends a registered memory to ``peer`` (which takes it with ``recv_memory``)."""
        memory.send(self.native, peer, tag)

    def recv_memory(self, peer: int, tag: int = 0) -> Memory:
        """The memory ``peer`` sent under ``tag``, mapped here when it is on this node."""
        return Memory.recv(self.native, peer, tag)

    def port_channel_service(self, fifo_size: int = 512) -> PortChannelService:
        """A proxy for PortChannels of this communicator (``add_semaphore``, ``add_memory``,
        ``port_channel``, then ``start``)."""
        return PortChannelService(self.native, fifo_size)

    # ---- the collectives' state -----------------------------------------------------------

    def prepare(self) -> None:
        """Sets up every scratch region now (collective), so calls captured in a CUDA graph
        afterwards may take any algorithm."""
        self._collectives().prepare()

    @property
    def last_algorithm(self) -> Optional[str]:
        """The algorithm the last call on this rank ran (``None`` before the first)."""
        return self._collectives().last_algorithm()

    def config(self) -> Dict[str, int]:
        """The collectives' configuration, setting by setting."""
        return dict(self._collectives().config())

    def scratch_bytes(self) -> int:
        """Device memory held in scratch regions now."""
        return self._collectives().scratch_bytes()


def _ms(seconds: Optional[float]) -> Optional[int]:
    if seconds is None:
        return None
    if seconds <= 0:
        raise InvalidArgumentError("timeout must be positive")
    return max(1, int(seconds * 1000))


def _kept(obj: Any) -> Optional[BufferInfo]:
    """A scalar array kept referenced with a call's buffers."""
    return None if obj is None else resolve(obj)


def _counts(values: Sequence[int], n: int, what: str) -> List[int]:
    out = [int(v) for v in values]
    if len(out) != n:
        raise InvalidArgumentError(f"{what}: {len(out)} values, one per rank ({n}) expected")
    if any(v < 0 for v in out):
        raise InvalidArgumentError(f"{what}: negative values")
    return out


def _prefix(counts: List[int]) -> List[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out

"""Type stubs of the extension module ``mscclpp_rs._native`` (``python/src/*.rs``).

The package's private layer: addresses are integers the package takes from live arrays after
checking them (``mscclpp_rs.arrays``). ``mypy.stubtest`` checks these stubs against the built
module in CI.
"""

from typing import Dict, List, Optional, Tuple, final

from typing_extensions import Self

__all__ = [
    "Buffer",
    "Collectives",
    "Comm",
    "Connection",
    "Memory",
    "MemoryChannel",
    "MemorySemaphore",
    "Op",
    "PortChannelService",
    "Registration",
    "Stream",
    "UniqueId",
    "VERSION",
    "constants",
    "device_count",
    "headers",
    "layouts",
]

VERSION: str

def layouts() -> List[Tuple[str, int, int, List[Tuple[str, int]]]]:
    """Every shared struct as Rust lays it out: ``(name, size, align, [(field, offset)])``."""

def constants() -> List[Tuple[str, int]]:
    """The constants ``layout.h`` defines with the same values."""

def headers() -> List[Tuple[str, str]]:
    """``(file name, text)`` of ``layout.h`` and ``device.cuh``."""

def device_count(backend: Optional[str] = None) -> int:
    """Devices of ``backend`` (``None``: the selected one)."""

@final
class UniqueId:
    BYTES: int
    @staticmethod
    def create(addr: Optional[str] = None) -> UniqueId: ...
    @staticmethod
    def from_bytes(data: bytes) -> UniqueId: ...
    @staticmethod
    def from_hex(text: str) -> UniqueId: ...
    def to_bytes(self) -> bytes: ...
    def hex(self) -> str: ...
    @property
    def root(self) -> str: ...
    @property
    def authenticated(self) -> bool: ...
    @property
    def holds_listener(self) -> bool: ...

@final
class Comm:
    @staticmethod
    def init(
        uid: UniqueId,
        rank: int,
        size: int,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        host_id: Optional[str] = None,
    ) -> Comm: ...
    @staticmethod
    def init_addr(
        addr: str,
        rank: int,
        size: int,
        secret: Optional[str] = None,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        host_id: Optional[str] = None,
    ) -> Comm: ...
    @staticmethod
    def from_env(
        device: Optional[int] = None,
        backend: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
    ) -> Comm: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> int: ...
    @property
    def device_name(self) -> str: ...
    @property
    def status_ptr(self) -> int: ...
    def layout(self) -> Tuple[List[int], List[int]]: ...
    def barrier(self) -> None: ...
    def all_gather_bytes(self, data: bytes) -> List[bytes]: ...
    def broadcast_bytes(self, root: int, data: bytes) -> bytes: ...
    def send_bytes(self, peer: int, tag: int, data: bytes) -> None: ...
    def recv_bytes(self, peer: int, tag: int) -> bytes: ...
    def split(self, color: Optional[int], key: int) -> Optional[Comm]: ...
    def abort(self) -> None: ...
    def check(self) -> None: ...
    def reset_status(self) -> None: ...

@final
class Op:
    @staticmethod
    def all_reduce(
        input: int,
        output: int,
        count: int,
        dtype: int,
        op: str,
        scalar: Optional[float] = None,
        scalar_ptr: Optional[int] = None,
        algorithm: Optional[str] = None,
    ) -> Op: ...
    @staticmethod
    def all_gather(
        input: int, output: int, count: int, dtype: int, algorithm: Optional[str] = None
    ) -> Op: ...
    @staticmethod
    def reduce_scatter(
        input: int,
        output: int,
        count: int,
        dtype: int,
        op: str,
        scalar: Optional[float] = None,
        scalar_ptr: Optional[int] = None,
        algorithm: Optional[str] = None,
    ) -> Op: ...
    @staticmethod
    def broadcast(
        input: int, output: int, count: int, dtype: int, root: int,
        algorithm: Optional[str] = None,
    ) -> Op: ...
    @staticmethod
    def reduce(
        input: int,
        output: int,
        count: int,
        dtype: int,
        op: str,
        root: int,
        scalar: Optional[float] = None,
        scalar_ptr: Optional[int] = None,
        algorithm: Optional[str] = None,
    ) -> Op: ...
    @staticmethod
    def all_to_all(
        input: int, output: int, count: int, dtype: int, algorithm: Optional[str] = None
    ) -> Op: ...
    @staticmethod
    def gather(input: int, output: int, count: int, dtype: int, root: int) -> Op: ...
    @staticmethod
    def scatter(input: int, output: int, count: int, dtype: int, root: int) -> Op: ...
    @staticmethod
    def all_to_allv(
        input: int,
        send_counts: List[int],
        send_displs: List[int],
        output: int,
        recv_counts: List[int],
        recv_displs: List[int],
        dtype: int,
    ) -> Op: ...
    @staticmethod
    def send(input: int, count: int, dtype: int, peer: int) -> Op: ...
    @staticmethod
    def recv(output: int, count: int, dtype: int, peer: int) -> Op: ...

@final
class Registration:
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def is_window(self) -> bool: ...

@final
class Collectives:
    def __new__(cls, comm: Comm, settings: Optional[Dict[str, int]] = None) -> Self: ...
    def run(self, op: Op, stream: Optional[int] = None) -> None: ...
    def run_group(self, ops: List[Op], stream: Optional[int] = None) -> None: ...
    def send_recv(
        self,
        input: int,
        next: int,
        output: int,
        prev: int,
        count: int,
        dtype: int,
        stream: Optional[int] = None,
    ) -> None: ...
    def synchronize(self) -> None: ...
    def register_buffer(self, ptr: int, nbytes: int) -> Registration: ...
    def deregister(self, reg: Registration) -> None: ...
    def register_window(self, ptr: int, nbytes: int) -> Registration: ...
    def deregister_window(self, reg: Registration) -> None: ...
    def registrations(self) -> Tuple[int, int]: ...
    def prepare(self) -> None: ...
    def last_algorithm(self) -> Optional[str]: ...
    def scratch_bytes(self) -> int: ...
    def config(self) -> Dict[str, int]: ...

@final
class Buffer:
    def __new__(cls, comm: Comm, nbytes: int) -> Self: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> int: ...
    def copy_from(self, offset: int, data: bytes) -> None: ...
    def copy_to(self, offset: int, nbytes: int) -> bytes: ...

@final
class Stream:
    def __new__(cls, comm: Comm) -> Self: ...
    @property
    def handle(self) -> int: ...
    def synchronize(self) -> None: ...

@final
class Connection:
    def __new__(
        cls, comm: Comm, peer: int, tag: int = 0, transport: Optional[str] = None
    ) -> Self: ...
    @property
    def peer(self) -> int: ...
    @property
    def transport(self) -> str: ...

@final
class Memory:
    @staticmethod
    def register(comm: Comm, buffer: Buffer, transport: Optional[str] = None) -> Memory: ...
    @staticmethod
    def recv(comm: Comm, peer: int, tag: int = 0) -> Memory: ...
    def send(self, comm: Comm, peer: int, tag: int = 0) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def ptr(self) -> Optional[int]: ...

@final
class MemorySemaphore:
    def __new__(cls, conn: Connection, tag: int = 0) -> Self: ...
    def handle(self) -> bytes: ...

@final
class MemoryChannel:
    def __new__(
        cls,
        conn: Connection,
        dst: Memory,
        src: Buffer,
        packet_buffer: Optional[Buffer] = None,
        tag: int = 0,
    ) -> Self: ...
    def handle(self) -> bytes: ...

@final
class PortChannelService:
    def __new__(cls, comm: Comm, fifo_size: int = 512) -> Self: ...
    def add_semaphore(self, conn: Connection, tag: int = 0) -> int: ...
    def add_memory(self, mem: Memory) -> int: ...
    def port_channel(self, semaphore: int, dst: int, src: int) -> bytes: ...
    def start(self) -> None: ...
    def error(self) -> Optional[str]: ...
    def stop(self) -> None: ...
    @property
    def running(self) -> bool: ...

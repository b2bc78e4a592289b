"""Frames on a pipe: a JSON header plus raw tensor bytes. Nothing is ever unpickled.

A frame is::

    b"ACW1" | header length (uint32, big-endian) | payload length (uint64, big-endian)
    header: UTF-8 JSON {"tensors": [{"dtype", "shape", "strides", "device"}, ...], ...message...}
    payload: each tensor's bytes in memory order, in turn, each starting at a multiple of 64

Strides cross too (only dense layouts: a permutation of contiguous strides), so a transposed
input reaches the implementation transposed, as it would in-process.

Both lengths are checked against the receiver's limits before anything is read, the tensor
descriptors (known dtype, sane shape, sizes adding up to the payload) before the payload is
read, and every read on the checker's side has a deadline. Tensors are rebuilt with
``torch.frombuffer`` from bytes the receiver owns.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.worker.codec import DTYPES, NAMES
from conformance.worker.errors import ProtocolError

MAGIC = b"ACW1"
PREFIX = struct.Struct(">4sIQ")
ALIGN = 64
MAX_DIMS = 8
_DEVICE = re.compile(r"^(cpu|mps|cuda(:\d{1,2})?)$")


class Deadline(Exception):
    """A read or write on the checker's side did not finish in time."""


class Closed(Exception):
    """The other end closed the pipe."""


@dataclass(frozen=True)
class Frame:
    """One message: its JSON header (without the tensor table) and its tensors."""

    header: dict[str, Any]
    tensors: list[torch.Tensor]


def _dense_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data on the CPU, laid out as ``clone()`` lays it out (a dense permuted layout
    such as a transpose keeps its strides, anything else becomes contiguous), so the receiver
    sees the memory layout an in-process run would give the implementation. A plain contiguous
    CPU tensor is that already and is sent as it is (its bytes are written before anything runs
    that could change them); anything else is copied. A subclass's ``__torch_function__`` is
    not consulted: what crosses is the data."""
    if (type(tensor) is torch.Tensor and tensor.layout is torch.strided
            and tensor.device.type == "cpu" and tensor.is_contiguous()
            and not tensor.is_conj() and not tensor.is_neg()):
        return tensor.detach()
    with torch._C.DisableTorchFunctionSubclass():
        plain = tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor
        return plain.detach().to("cpu").resolve_conj().resolve_neg().clone()


def _memory_order_bytes(dense: torch.Tensor) -> memoryview:
    if dense.numel() == 0:
        return memoryview(b"")
    flat = dense.as_strided((dense.numel(),), (1,), dense.storage_offset())
    return memoryview(flat.view(torch.uint8).numpy())


def _dense_strides(shape: list[int], strides: object) -> bool:
    """Whether ``strides`` lay out ``shape`` densely (a permutation of contiguous strides)."""
    if (not isinstance(strides, list) or len(strides) != len(shape)
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**62
                       for s in strides)):
        return False
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(shape, strides, strict=True) if n > 1),
                               key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _padding(size: int) -> int:
    return -size % ALIGN


def encode_frame(header: dict[str, Any], tensors: Sequence[torch.Tensor]) -> list[memoryview]:
    """The frame as buffers to write in order (tensor bytes are not copied)."""
    table, chunks, payload = [], [], 0
    for tensor in tensors:
        name = NAMES.get(tensor.dtype)
        if name is None:
            raise ProtocolError(f"a {str(tensor.dtype).removeprefix('torch.')} tensor cannot cross")
        device = str(tensor.device)
        data = _dense_cpu(tensor)
        raw = _memory_order_bytes(data)
        table.append({"dtype": name, "shape": list(data.shape), "strides": list(data.stride()),
                      "device": device})
        chunks.append(raw)
        payload += len(raw) + _padding(len(raw))
    text = json.dumps({**header, "tensors": table}, separators=(",", ":")).encode()
    buffers = [memoryview(PREFIX.pack(MAGIC, len(text), payload)), memoryview(text)]
    for raw in chunks:
        buffers.append(raw)
        if _padding(len(raw)):
            buffers.append(memoryview(bytes(_padding(len(raw)))))
    return buffers


def _layout(table: Any, payload: int, devices: Callable[[str], bool]) -> list[tuple]:
    """(dtype, shape, device, offset, nbytes) per tensor; ProtocolError unless it all adds up."""
    if not isinstance(table, list):
        raise ProtocolError("the tensor table is not a list")
    layout, offset = [], 0
    for i, entry in enumerate(table):
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "strides", "device"}:
            raise ProtocolError(f"tensor {i}: malformed descriptor")
        dtype, shape, device = entry["dtype"], entry["shape"], entry["device"]
        if dtype not in DTYPES:
            raise ProtocolError(f"tensor {i}: unknown dtype {str(dtype)[:40]!r}")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**40
                           for n in shape)):
            raise ProtocolError(f"tensor {i}: malformed shape")
        if not _dense_strides(shape, entry["strides"]):
            raise ProtocolError(f"tensor {i}: strides are not a dense layout of its shape")
        if not isinstance(device, str) or not _DEVICE.match(device) or not devices(device):
            raise ProtocolError(f"tensor {i}: device {str(device)[:40]!r} is not available here")
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        layout.append((DTYPES[dtype], shape, entry["strides"], device, offset, nbytes))
        offset += nbytes + _padding(nbytes)
    if offset != payload:
        raise ProtocolError(f"the tensors need {offset} payload bytes, the frame has {payload}")
    return layout


def _tensors(layout: list[tuple], payload: bytearray) -> list[torch.Tensor]:
    tensors = []
    for dtype, shape, strides, device, offset, nbytes in layout:
        if nbytes == 0:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            # A copy: the payload is one buffer, and each tensor gets aligned memory of its own.
            flat = torch.frombuffer(payload, dtype=dtype, count=nbytes // dtype.itemsize,
                                    offset=offset).clone()
            tensor = flat.as_strided(shape, strides)
        tensors.append(tensor if device == "cpu" else tensor.to(device))
    return tensors


def _parse(prefix: bytes, header_limit: int, payload_limit: int) -> tuple[int, int]:
    magic, header_size, payload_size = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"not a frame (starts with {prefix[:4]!r})")
    if header_size > header_limit:
        raise ProtocolError(f"header of {header_size} bytes exceeds the {header_limit}-byte limit")
    if payload_size > payload_limit:
        raise ProtocolError(
            f"message of {payload_size} bytes exceeds the {payload_limit}-byte limit")
    return header_size, payload_size


def _header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ProtocolError(f"header is not JSON ({type(error).__name__})") from None
    if not isinstance(header, dict) or "tensors" not in header:
        raise ProtocolError("header is not a JSON object with a tensor table")
    return header


def _any_device(device: str) -> bool:
    if device == "cpu":
        return True
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        return torch.cuda.is_available() and index < torch.cuda.device_count()
    return device == "mps" and torch.backends.mps.is_available()


IOV_MAX = 512
"""Buffers handed to one ``writev`` (Linux allows 1024)."""

READ_AHEAD = 1 << 16
"""Bytes a read may take beyond what it needs: the next part of the frame, often the rest of it,
comes with the same system call (a frame is three reads: prefix, header, payload)."""


def _write_gathered(fd: int, buffers: Sequence[memoryview], wait: Callable[[], None]) -> None:
    """Write ``buffers`` in order, gathered (one system call where the pipe has room);
    ``wait()`` is called while the pipe is full (a non-blocking pipe)."""
    left = [buffer for buffer in buffers if len(buffer)]
    while left:
        try:
            written = os.writev(fd, left[:IOV_MAX])
        except BlockingIOError:
            wait()
            continue
        while written:  # drop what was written from the front
            if written >= len(left[0]):
                written -= len(left.pop(0))
            else:
                left[0], written = left[0][written:], 0


class _Reader:
    """Frames from a pipe, each read one system call where the bytes are there: every read
    asks for what it needs plus :data:`READ_AHEAD` more, and keeps the surplus for the next.
    ``closed`` is what :class:`Closed` says when the other end closes the pipe."""

    def __init__(self, fd: int, header_limit: int, payload_limit: int, closed: str) -> None:
        self.fd = fd
        self.header_limit, self.payload_limit = header_limit, payload_limit
        self.closed = closed
        self._surplus = bytearray()
        self._ahead = bytearray(READ_AHEAD)

    def frame(self, wait: Callable[[], None]) -> Frame:
        """The next frame, checked against the limits before its parts are read; ``wait()`` is
        called while no byte is ready (a non-blocking pipe)."""
        header_size, payload_size = _parse(bytes(self._read(PREFIX.size, wait)),
                                           self.header_limit, self.payload_limit)
        header = _header(bytes(self._read(header_size, wait)))
        layout = _layout(header.pop("tensors"), payload_size, _any_device)
        return Frame(header, _tensors(layout, self._read(payload_size, wait)))

    def _read(self, size: int, wait: Callable[[], None]) -> bytearray:
        if len(self._surplus) >= size:
            taken = self._surplus[:size]
            del self._surplus[:size]
            return taken
        buffer = bytearray(size)
        got = len(self._surplus)
        buffer[:got] = self._surplus
        self._surplus.clear()
        view = memoryview(buffer)
        while got < size:
            try:
                n = os.readv(self.fd, [view[got:], self._ahead])
            except BlockingIOError:
                wait()
                continue
            if n == 0:
                raise Closed(self.closed)
            if n > size - got:
                self._surplus += self._ahead[:n - (size - got)]
                n = size - got
            got += n
        return buffer


class BlockingChannel:
    """The worker's end: blocking reads and writes (the checker is trusted to behave)."""

    def __init__(self, read_fd: int, write_fd: int, header_limit: int, payload_limit: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self._reader = _Reader(read_fd, header_limit, payload_limit,
                               "the checker closed the pipe")

    def _until(self, readable: bool) -> None:
        # Only if a pipe was made non-blocking (by the submission): wait until it is ready.
        select.select([self.read_fd] if readable else [], [] if readable else [self.write_fd], [])

    def receive(self) -> Frame:
        return self._reader.frame(lambda: self._until(readable=True))

    def send(self, header: dict[str, Any], tensors: Sequence[torch.Tensor] = ()) -> None:
        self.write(encode_frame(header, tensors))

    def write(self, buffers: Sequence[memoryview]) -> None:
        """Write an encoded frame."""
        _write_gathered(self.write_fd, buffers, lambda: self._until(readable=False))


class CheckerChannel:
    """The checker's end: every read and write has a deadline. While it waits, ``pump`` is
    called whenever ``side`` (the worker's output pipe) has data, so printed output is drained
    (and capped) at the same time and a printing worker never blocks on a full pipe."""

    def __init__(self, read_fd: int, write_fd: int, header_limit: int, payload_limit: int,
                 side: int, pump: Callable[[], None]) -> None:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self.read_fd, self.write_fd = read_fd, write_fd
        self.side = side
        self.pump = pump
        """Drains ``side``; it may raise to abort the wait."""
        self._reader = _Reader(read_fd, header_limit, payload_limit,
                               "the worker closed its end of the pipe")

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event | select.POLLHUP | select.POLLERR)
        poller.register(self.side, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline()
            ready = poller.poll(left * 1000)
            if any(ready_fd == self.side for ready_fd, _ in ready):
                self.pump()
            if any(ready_fd == fd for ready_fd, _ in ready):
                return
            if any(ready_fd == self.side and flags & (select.POLLHUP | select.POLLERR)
                   for ready_fd, flags in ready):
                poller.unregister(self.side)  # the output pipe closed: stop watching it

    def receive(self, deadline: float) -> Frame:
        return self._reader.frame(lambda: self._wait(self.read_fd, select.POLLIN, deadline))

    def send(self, header: dict[str, Any], tensors: Sequence[torch.Tensor], deadline: float) -> None:
        self.write(encode_frame(header, tensors), deadline)

    def write(self, buffers: Sequence[memoryview], deadline: float) -> None:
        """Write encoded frames."""
        try:
            _write_gathered(self.write_fd, buffers,
                            lambda: self._wait(self.write_fd, select.POLLOUT, deadline))
        except BrokenPipeError:
            raise Closed("the worker closed its end of the pipe") from None

"""The worker's wire format and plain-data codec, without processes: round trips of everything
that crosses, new Capabilities fields carried without changes, malformed input rejected."""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import numpy as np
import pytest
import torch

from conformance import (
    Capabilities,
    CausalForm,
    Config,
    Declarations,
    Dtypes,
    MaskConvention,
    MaskKind,
    MaskLayout,
)
from conformance.model.remedies import Note, Remedy
from conformance.model.weights import HeadWeights
from conformance.subject.boundary import Gradients, Inputs
from conformance.worker import CodecError, decode, encode
from conformance.worker.errors import ProtocolError
from conformance.worker.protocol import Declaration, Failure, LoadReply
from conformance.worker.wire import BlockingChannel, CheckerChannel, Closed, Deadline, encode_frame


def roundtrip(value, expected_type):
    tensors: list[torch.Tensor] = []
    data = encode(value, tensors)
    return decode(data, expected_type, tensors)


def test_capabilities_config_and_declarations_round_trip():
    caps = Capabilities(call="qkv", mask=MaskConvention(MaskKind.ADDITIVE, MaskLayout.PER_HEAD,
                                                        "attn_mask"),
                        causality=CausalForm("optional", "is_causal"), cross_attention=True,
                        max_len=32, heads=1, floats=Dtypes((torch.float16, torch.bfloat16)),
                        weights=True, fully_masked="zeros", dropout=0.1,
                        mask_formats=(MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.KEY_PADDING),),
                        paths=(("need_weights=True", (("need_weights", True),)),))
    assert roundtrip(caps, Capabilities) == caps
    assert roundtrip(Capabilities(dropout="config"), Capabilities).dropout == "config"
    config = Config(batch=2, q_len=3, kv_len=4, d_model=8, num_heads=2, dropout=0.25,
                    dtype=torch.bfloat16)
    assert roundtrip(config, Config) == config
    declared = Declarations(mask="keep_int:broadcast", init=(("causal", True), ("bias", None)),
                            mask_formats=("additive:per_head",))
    assert roundtrip(declared, Declarations) == declared
    reply = LoadReply((Declaration("x", caps, "weights from q/k/v",
                                   (Note("inferred", Remedy.to("causal", "always", "say so")),),
                                   {"scale": "no"}),),
                      ("MultiHeadAttention",))
    assert roundtrip(reply, LoadReply) == reply


class PositionalEncoding(str, Enum):
    ROPE = "rope"
    ALIBI = "alibi"


@dataclass(frozen=True)
class FutureCapabilities(Capabilities):
    """Fields of the kinds other engineers are adding to Capabilities."""

    allowed_heads: tuple[int, ...] | None = None
    allowed_head_dims: tuple[int, ...] | None = (8, 16)
    mask_problem: str | None = None
    positional: tuple[PositionalEncoding, ...] = ()
    position_kinds: tuple[Literal["absolute", "relative"], ...] = ()
    limits: dict[str, int] = field(default_factory=dict)


def test_new_capability_fields_cross_without_codec_changes():
    caps = FutureCapabilities(heads=2, allowed_heads=(1, 2, 4), allowed_head_dims=None,
                              mask_problem="inverted", positional=(PositionalEncoding.ROPE,),
                              position_kinds=("relative",), limits={"max": 3})
    back = roundtrip(caps, FutureCapabilities)
    assert back == caps and isinstance(back.positional[0], PositionalEncoding)
    with pytest.raises(CodecError, match=r"positional\[0\]: expected one of 'rope', 'alibi'"):
        decode({**encode(caps, []), "positional": ["sinusoid"]}, FutureCapabilities, [])
    with pytest.raises(CodecError, match=r"allowed_heads\[1\]: expected an integer"):
        decode({**encode(caps, []), "allowed_heads": [1, "2"]}, FutureCapabilities, [])


def test_tensors_keep_identity_dtype_and_layout():
    x = torch.randn(2, 5, 8).transpose(1, 2).contiguous().transpose(1, 2)  # dense, not contiguous
    inputs = Inputs.self_attention(x, torch.tensor([[True] * 5, [True, False] * 2 + [True]]))
    tensors: list[torch.Tensor] = []
    data = encode(inputs, tensors)
    assert len(tensors) == 2  # query, key and value are one tensor
    channel_tensors = _through_pipe({"body": data}, tensors)
    back = decode(data, Inputs, channel_tensors)
    assert back.is_self and torch.equal(back.query, x) and back.query.stride() == x.stride()
    assert back.keep.dtype == torch.bool and torch.equal(back.keep, inputs.keep)

    weights = HeadWeights(*(torch.randn(2, 3, 6, dtype=torch.bfloat16) if i % 2 == 0 else
                            torch.randn(2, 3, dtype=torch.bfloat16) for i in range(6)))
    grads = Gradients(torch.randn(()), {"x": torch.zeros(0, 3)}, {"w": None, "b": torch.ones(2)})
    back = decode(encode(weights, t := []), HeadWeights, _through_pipe({}, t))
    assert back.w_q.dtype == torch.bfloat16 and torch.equal(back.w_q, weights.w_q)
    assert back.w_o is None
    back = decode(encode(grads, t := []), Gradients, _through_pipe({}, t))
    assert back.output.shape == () and back.inputs["x"].shape == (0, 3)
    assert back.parameters["w"] is None and torch.equal(back.parameters["b"], torch.ones(2))


def test_a_tensor_subclass_crosses_as_its_data():
    class Liar(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.clone:
                return torch.zeros(3)
            return super().__torch_function__(func, types, args, kwargs or {})

    (back,) = _through_pipe({}, [torch.arange(3.0).as_subclass(Liar)])
    assert type(back) is torch.Tensor and torch.equal(back, torch.arange(3.0))


def test_a_plain_contiguous_tensor_is_written_from_its_own_memory():
    """A plain contiguous CPU tensor's bytes are written from the tensor itself (no copy on the
    way); a view with an offset, a tensor that requires grad, a strided one, an empty one and a
    contiguous one with an odd stride on a size-1 dimension each cross with their values and
    the layout clone() gives them (the strided one contiguous, the odd stride kept)."""
    base = torch.arange(24.0).reshape(4, 6)
    plain = base[1:]  # contiguous, at an offset into its storage
    payload = encode_frame({}, [plain])[2]
    assert np.asarray(payload).__array_interface__["data"][0] == plain.data_ptr()

    odd = torch.empty_strided((2, 1, 3), (3, 100, 1)).copy_(torch.randn(2, 1, 3))  # contiguous
    sent = [plain, torch.randn(3, 2, requires_grad=True), base[:, ::2], torch.zeros(0, 5), odd]
    back = _through_pipe({}, sent)
    for original, received in zip(sent, back, strict=True):
        assert torch.equal(received, original.detach())
        assert received.stride() == original.clone().stride() or original.numel() == 0
    assert back[2].is_contiguous() and not back[1].requires_grad


def _nested(depth):
    value = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("data, expected, message", [
    ({"call": "self", "heads": "2"}, Capabilities, r"capabilities\.heads: expected an integer"),
    ({"call": "both"}, Capabilities, r"capabilities\.call: expected one of 'self', 'qkv'"),
    ({"floats": {"supported": ["float32", "evil"]}}, Capabilities,
     r"capabilities\.floats\.supported\[1\]: expected a dtype name"),
    ({"secret": 1}, Capabilities, r"Capabilities has no field\(s\) secret"),
    ({"batch": 1}, Config, r"Config\.q_len is missing"),
    ({"paths": [["p", [["k", {"__reduce__": "os.system"}]]]]}, Capabilities,
     r"expected a JSON scalar or list"),
    ({"kind": "status", "message": "x", "status": "hacked"}, Failure, r"failure\.status"),
    (_nested(40), tuple, "nested too deeply"),
])
def test_malformed_values_are_rejected_with_where(data, expected, message):
    with pytest.raises(CodecError, match=message):
        decode(data, expected, [], expected.__name__.lower() if expected is not tuple else "x")


def test_tensor_references_are_checked():
    with pytest.raises(CodecError, match=r"expected a tensor reference \(0 to 0\)"):
        decode({"$tensor": 1}, torch.Tensor, [torch.zeros(1)])
    with pytest.raises(CodecError, match="expected a tensor reference"):
        decode({"$tensor": True}, torch.Tensor, [torch.zeros(1)])
    with pytest.raises(CodecError, match="cannot cross"):
        encode(object(), [])


def _through_pipe(header, tensors):
    """Send a frame through a real pipe with the worker's writer and the checker's reader."""
    read_fd, write_fd = os.pipe()
    try:
        writer = BlockingChannel(-1, write_fd, 1 << 20, 1 << 30)
        sender = threading.Thread(target=writer.send, args=(header, tensors))
        sender.start()
        reader = CheckerChannel(read_fd, os.open(os.devnull, os.O_WRONLY), 1 << 20, 1 << 30,
                                os.open(os.devnull, os.O_RDONLY), lambda: None)
        frame = reader.receive(time.monotonic() + 10)
        sender.join()
        return frame.tensors
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _receive_raw(raw: bytes, header_limit=1 << 16, payload_limit=1 << 20, timeout=2.0):
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, raw)
        os.close(write_fd)
        write_fd = -1
        side = os.open(os.devnull, os.O_RDONLY)
        reader = CheckerChannel(read_fd, os.open(os.devnull, os.O_WRONLY), header_limit,
                                payload_limit, side, lambda: None)
        return reader.receive(time.monotonic() + timeout)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def _frame(header: dict, payload: bytes = b"") -> bytes:
    text = __import__("json").dumps(header).encode()
    return b"ACW1" + struct.pack(">IQ", len(text), len(payload)) + text + payload


@pytest.mark.parametrize("raw, message", [
    (b"PASS" * 8, "not a frame"),
    (b"ACW1" + struct.pack(">IQ", 1 << 30, 0), "header of 1073741824 bytes exceeds"),
    (b"ACW1" + struct.pack(">IQ", 2, 1 << 40), "message of 1099511627776 bytes exceeds"),
    (_frame({"tensors": []}) .replace(b"tensors", b"tensorz"), "tensor table"),
    (b"ACW1" + struct.pack(">IQ", 3, 0) + b"\xff\xfe{", "not JSON"),
    (_frame({"tensors": [{"dtype": "object", "shape": [1], "strides": [1], "device": "cpu"}]}),
     "unknown dtype"),
    (_frame({"tensors": [{"dtype": "float32", "shape": [2, 2], "strides": [1, 1],
                          "device": "cpu"}]}, bytes(64)), "not a dense layout"),
    (_frame({"tensors": [{"dtype": "float32", "shape": [4], "strides": [1], "device": "cpu"}]},
            bytes(8)), "need 64 payload bytes, the frame has 8"),
    (_frame({"tensors": [{"dtype": "float32", "shape": [-4], "strides": [1], "device": "cpu"}]}),
     "malformed shape"),
    (_frame({"tensors": [{"dtype": "float32", "shape": [1], "strides": [1],
                          "device": "/dev/sda"}]}, bytes(64)), "not available here"),
])
def test_malformed_frames_are_rejected_before_reading_on(raw, message):
    with pytest.raises(ProtocolError, match=message):
        _receive_raw(raw)


def test_reads_have_deadlines_and_see_closed_pipes():
    read_fd, write_fd = os.pipe()
    reader = CheckerChannel(read_fd, os.open(os.devnull, os.O_WRONLY), 1 << 16, 1 << 20,
                            os.open(os.devnull, os.O_RDONLY), lambda: None)
    os.write(write_fd, b"ACW1")  # a frame that never finishes
    start = time.monotonic()
    with pytest.raises(Deadline):
        reader.receive(time.monotonic() + 0.3)
    assert time.monotonic() - start < 1.0
    os.close(write_fd)
    with pytest.raises(Closed):
        reader.receive(time.monotonic() + 1)
    os.close(read_fd)


def test_writes_to_a_worker_that_never_reads_have_deadlines():
    read_fd, write_fd = os.pipe()
    channel = CheckerChannel(os.open(os.devnull, os.O_RDONLY), write_fd, 1 << 16, 1 << 20,
                             os.open(os.devnull, os.O_RDONLY), lambda: None)
    start = time.monotonic()
    with pytest.raises(Deadline):  # 8 MB into a 64 KiB pipe nobody drains
        channel.send({"op": "forward"}, [torch.zeros(1 << 21)], time.monotonic() + 0.3)
    assert time.monotonic() - start < 1.0
    os.close(read_fd)
    os.close(write_fd)


def test_frames_carry_every_dtype():
    tensors = [torch.tensor([True, False]), torch.arange(5, dtype=torch.int64),
               torch.randn(3, dtype=torch.float16), torch.randn(2, 2, dtype=torch.bfloat16),
               torch.randn(4, dtype=torch.float64), torch.randn(2, dtype=torch.complex64).conj(),
               torch.tensor(7.5)]
    back = _through_pipe({"x": 1}, tensors)
    for original, received in zip(tensors, back, strict=True):
        assert received.dtype == original.dtype and torch.equal(received, original.resolve_conj())
    payload = sum(len(b) for b in encode_frame({}, tensors)[2:])
    assert payload == 64 * len(tensors)  # each tensor starts aligned: all of these fit in 64 bytes


def test_frames_that_share_a_read_or_span_many_come_out_whole_and_in_order():
    """Reads take what the pipe holds beyond the frame they need (READ_AHEAD): several small
    frames written at once, then one larger than the pipe and the read-ahead, each arrive
    exactly, in order, from both ends' readers."""
    small = [({"id": n}, [torch.full((3,), float(n))]) for n in range(5)]
    large = ({"id": 5}, [torch.arange(300_000, dtype=torch.float32)])
    for reader_end in ("checker", "worker"):
        read_fd, write_fd = os.pipe()
        writer = BlockingChannel(-1, write_fd, 1 << 20, 1 << 30)
        gathered = [buffer for header, tensors in small for buffer in encode_frame(header, tensors)]
        sender = threading.Thread(target=lambda writer=writer, gathered=gathered: (
            writer.write(gathered), writer.send(*large)))
        sender.start()
        if reader_end == "checker":
            reader = CheckerChannel(read_fd, os.open(os.devnull, os.O_WRONLY), 1 << 20, 1 << 30,
                                    os.open(os.devnull, os.O_RDONLY), lambda: None)
            frames = [reader.receive(time.monotonic() + 10) for _ in range(6)]
        else:
            reader = BlockingChannel(read_fd, -1, 1 << 20, 1 << 30)
            frames = [reader.receive() for _ in range(6)]
        sender.join()
        os.close(write_fd)
        assert [frame.header["id"] for frame in frames] == list(range(6))
        for frame, (_, tensors) in zip(frames, [*small, large], strict=True):
            assert torch.equal(frame.tensors[0], tensors[0])
        with pytest.raises(Closed):  # nothing left over after the last frame
            reader.receive(time.monotonic() + 1) if reader_end == "checker" else reader.receive()
        os.close(read_fd)

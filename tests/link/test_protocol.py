"""Framing, out-of-band buffers, and serializing a broadcast once."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

import skyward as sky
from skyward.link import protocol as proto
from skyward.link.turns import PipeReader


def _roundtrip(message: object, payload: proto.Parts | None) -> tuple[object, proto.Parts]:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb", buffering=0) as reader:
        parts = proto.frame(message, payload)
        size = sum(memoryview(p).nbytes for p in parts)
        assert size < 1 << 16  # fits in the pipe buffer, so one thread can do both ends
        proto.write_parts(write_fd, parts)
        os.close(write_fd)
        return proto.read_frame(reader.readinto)  # type: ignore[arg-type]


def test_a_frame_carries_a_message_and_its_payload() -> None:
    payload = proto.dumps({"a": [1, 2, 3]})
    message, parts = _roundtrip(proto.Call(7, "f"), payload)
    assert message == proto.Call(7, "f")
    assert proto.loads(parts) == {"a": [1, 2, 3]}


def test_every_call_and_result_survives_the_packed_encoding() -> None:
    # A call and a result are packed rather than pickled (see proto.frame); the others,
    # and calls that stream or relay, are pickles. Each must come back equal.
    relay = proto.Relay(b"t" * 16, chain=((1, "10.0.0.2", 4000),))
    messages: list[object] = [
        proto.Call(1, "noop"),
        proto.Call(2**63 + 5, "f.<locals>.g ünïcode"),
        proto.Call(3, ""),
        proto.Call(4, "gen", window=8),
        proto.Call(5, "feed", inputs=2),
        proto.Call(6, "bcast", relay=relay),
        proto.Result(7, True),
        proto.Result(8, False),
        proto.Log(b"hello"),
    ]
    for message in messages:
        for payload in (None, proto.dumps(None), proto.dumps(b"x" * 10_000)):
            got, parts = _roundtrip(message, payload)
            assert got == message
            assert type(got) is type(message)
            assert proto.loads(parts) == proto.loads(payload) if payload else parts == []


def test_a_plain_call_and_a_result_are_framed_alike_without_making_their_messages() -> None:
    # frame_call and frame_result (every call's path) write what frame writes.
    for payload in ([], proto.dumps(None), proto.dumps(b"x" * 10_000), proto.dumps(np.ones(3))):
        for call_id, name in ((1, "noop"), (2**63 + 5, "f.<locals>.g ünïcode"), (3, "")):
            expected = proto.frame(proto.Call(call_id, name), payload)
            assert proto.frame_call(call_id, name, payload) == expected
        for ok in (True, False):
            expected = proto.frame(proto.Result(9, ok), payload)
            assert proto.frame_result(9, ok, payload) == expected


@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "non-blocking"])
def test_the_pipe_reader_reads_frames_whole_split_or_several_at_once(nonblocking: bool) -> None:
    # PipeReader.read_frame parses frames from its buffer when they are all there; frames
    # that arrive in pieces, or are larger than its buffer, are read part by part. A
    # non-blocking reader (the client's end) waits for the pieces as a blocking one does.
    big = np.arange(50_000, dtype=np.float64)  # 400 KB: larger than the reader's buffer
    frames = [
        (proto.Call(1, "a"), proto.dumps(((), {}))),
        (proto.Result(1, True), proto.dumps(None)),
        (proto.Log(b"x" * 100), None),
        (proto.Result(2, True), proto.dumps(big)),
        (proto.Result(3, False), proto.dumps("after the big one")),
    ]
    wire = b"".join(bytes(p) for m, pl in frames for p in proto.frame(m, pl))
    read_fd, write_fd = os.pipe()

    def write() -> None:  # in uneven pieces, so frames straddle reads
        for start in range(0, len(wire), 7_777):
            os.write(write_fd, wire[start : start + 7_777])
        os.close(write_fd)

    writer = threading.Thread(target=write)
    writer.start()
    reader = PipeReader(read_fd, nonblocking=nonblocking)
    try:
        for message, payload in frames:
            got, parts = reader.read_frame()
            assert got == message
            if payload is None:
                assert parts == []
            else:
                value = proto.loads(parts)
                if isinstance(value, np.ndarray):
                    np.testing.assert_array_equal(value, big)
                else:
                    assert value == proto.loads(payload)
        try:
            reader.read_frame()
        except EOFError:
            pass
        else:
            raise AssertionError("the end of the stream must be an EOFError")
    finally:
        writer.join()
        os.close(read_fd)


def test_read_ahead_says_whether_a_frame_is_there_without_waiting_for_one() -> None:
    read_fd, write_fd = os.pipe()
    try:
        reader = PipeReader(read_fd, nonblocking=True)
        assert not reader.read_ahead()  # nothing yet: it returns at once
        frame = proto.frame(proto.Result(1, True), proto.dumps("value"))
        os.write(write_fd, b"".join(bytes(p) for p in frame))
        assert reader.read_ahead()
        assert reader.read_ahead()  # the frame is in its buffer now, still unread
        message, parts = reader.read_frame()
        assert message == proto.Result(1, True)
        assert proto.loads(parts) == "value"
        assert not reader.read_ahead()
        os.close(write_fd)
        write_fd = -1
        assert reader.read_ahead()  # the end of the stream: the next read says so
        with pytest.raises(EOFError):
            reader.read_frame()
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_a_blocking_pipe_reader_reads_ahead_only_what_it_buffered() -> None:
    # The worker's end stays blocking: its idle main thread waits in one read instead.
    read_fd, write_fd = os.pipe()
    try:
        reader = PipeReader(read_fd)
        os.write(write_fd, b"".join(bytes(p) for p in proto.frame(proto.Result(1, True))))
        assert not reader.read_ahead()
        assert os.get_blocking(read_fd)
        assert reader.read_frame()[0] == proto.Result(1, True)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_numpy_arrays_travel_out_of_band_and_are_not_copied_on_arrival() -> None:
    array = np.arange(1000, dtype=np.float32)
    payload = proto.dumps(array)
    assert len(payload) == 2  # the pickle stream, and the array's own buffer
    assert memoryview(payload[1]).nbytes == array.nbytes
    _, parts = _roundtrip(proto.Result(1, True), payload)
    received = proto.loads(parts)
    np.testing.assert_array_equal(received, array)
    # the array uses the buffer the frame was read into, not a copy of it
    assert np.shares_memory(received, np.frombuffer(parts[1], dtype=np.float32))


def test_a_corrupt_header_is_an_eof_not_a_huge_allocation() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"\xff\xff\xff\xffgarbage")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb", buffering=0) as reader:
        try:
            proto.read_frame(reader.readinto)  # type: ignore[arg-type]
        except EOFError as exc:
            assert "corrupt frame header" in str(exc)
        else:
            raise AssertionError("a corrupt header must not parse")


class CountsPickling:
    """Appends a line to a file each time it is pickled (on the client)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        with open(self.path, "a") as f:
            f.write("pickled\n")
        return (CountsPickling, (self.path,))


def test_a_broadcast_serializes_its_payload_once(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    with sky.ComputePool(nodes=4, quiet=True) as pool:
        results = pool.broadcast(lambda x: type(x).__name__, CountsPickling(str(counter)))
    assert results == ["CountsPickling"] * 4
    assert counter.read_text().splitlines() == ["pickled"]


def test_control_messages_are_plain_pickles() -> None:
    hello = proto.Hello(python=(3, 11, 7), pid=1, hostname="h", head_port=None)
    assert pickle.loads(pickle.dumps(hello)) == hello

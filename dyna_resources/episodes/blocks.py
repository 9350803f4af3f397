"""`dyna.SampleBlock`: many samples of a numeric stream in one protobuf message.

Schema (proto3, package ``dyna``)::

    message SampleBlock {
      repeated sfixed64 timestamp_ns = 1;   // one per sample, ns since the Unix epoch
      repeated Field fields = 2;            // e.g. position, velocity, effort
    }
    message Field {
      string name = 1;
      uint32 width = 2;                     // columns; values holds n_samples * width
      repeated double values = 3;           // row-major (sample, column)
    }

Column labels (joint names and the like) are channel metadata, not repeated per message.

Why a codec of our own next to protobuf's: the Python protobuf runtime turns every
element of a repeated field into a Python float (~50 ns each), which costs more than
the I/O for 200 Hz streams. Fixed-width packed fields are little-endian arrays on the
wire, so we write and read them with numpy directly. The bytes are standard protobuf:
any protobuf reader (Foxglove, the mcap CLI) decodes them with the schema below, and
tests check both directions against the protobuf runtime.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_NAME = "dyna.SampleBlock"
PROTO_FILE = "dyna/sample_block.proto"


@cache
def file_descriptor_set_bytes() -> bytes:
    """The schema as a serialized FileDescriptorSet (the MCAP protobuf schema encoding)."""
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(_file_descriptor_proto())
    return fds.SerializeToString()


def _file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name=PROTO_FILE, package="dyna", syntax="proto3")
    field_msg = fd.message_type.add(name="Field")
    field_msg.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    field_msg.field.add(name="width", number=2, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
    field_msg.field.add(name="values", number=3, type=F.TYPE_DOUBLE, label=F.LABEL_REPEATED)
    block = fd.message_type.add(name="SampleBlock")
    block.field.add(name="timestamp_ns", number=1, type=F.TYPE_SFIXED64, label=F.LABEL_REPEATED)
    block.field.add(name="fields", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".dyna.Field")
    return fd


@cache
def protobuf_class():
    """The generated protobuf message class (for interop checks and the slow fallback)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor_proto())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(SCHEMA_NAME))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def encode_block(timestamps_ns: np.ndarray, fields: dict[str, np.ndarray]) -> bytes:
    """Serialize one block; ``fields`` map a name to an (n, width) array (n = len(timestamps))."""
    ts = np.ascontiguousarray(timestamps_ns, dtype="<i8")
    parts = []
    if len(ts):
        payload = ts.tobytes()
        parts += [b"\x0a", _varint(len(payload)), payload]
    for name, arr in fields.items():
        arr = np.asarray(arr)
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.shape[0] != len(ts):
            raise ValueError(f"field {name}: {arr.shape[0]} rows for {len(ts)} timestamps")
        name_b = name.encode()
        sub = [b"\x0a", _varint(len(name_b)), name_b, b"\x10", _varint(arr.shape[1])]
        if arr.size:
            values = np.ascontiguousarray(arr, dtype="<f8").tobytes()
            sub += [b"\x1a", _varint(len(values)), values]
        sub_b = b"".join(sub)
        parts += [b"\x12", _varint(len(sub_b)), sub_b]
    return b"".join(parts)


class _NotFastPath(Exception):
    pass


def decode_block(data: bytes | memoryview) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Parse one block into (timestamps_ns int64 (n,), {name: float64 (n, width)})."""
    try:
        return _decode_fast(data)
    except _NotFastPath:
        return _decode_with_protobuf(data)


def _decode_fast(data: bytes | memoryview) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    buf = memoryview(data)
    pos, end = 0, len(buf)
    ts = np.empty(0, dtype=np.int64)
    fields: dict[str, np.ndarray] = {}
    while pos < end:
        key, pos = read_varint(buf, pos)
        if key & 7 != 2:  # unpacked scalars or unknown wire types: let protobuf handle it
            raise _NotFastPath
        length, pos = read_varint(buf, pos)
        if key >> 3 == 1:
            ts = np.frombuffer(data, dtype="<i8", count=length // 8, offset=pos).astype(np.int64)
        elif key >> 3 == 2:
            name, width, values = _decode_field(data, buf, pos, pos + length)
            fields[name] = values.reshape(-1, width) if width else values.reshape(len(values), 0)
        else:
            raise _NotFastPath
        pos += length
    for name, arr in fields.items():
        if arr.shape[0] != len(ts):
            raise ValueError(f"sample block field {name}: {arr.shape[0]} rows for {len(ts)} timestamps")
    return ts, fields


def _decode_field(data: bytes | memoryview, buf: memoryview, pos: int, end: int):
    name, width, values = "", 0, np.empty(0, dtype=np.float64)
    while pos < end:
        key, pos = read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0 and num == 2:
            width, pos = read_varint(buf, pos)
            continue
        if wire != 2:
            raise _NotFastPath
        length, pos = read_varint(buf, pos)
        if num == 1:
            name = bytes(buf[pos : pos + length]).decode()
        elif num == 3:
            values = np.frombuffer(data, dtype="<f8", count=length // 8, offset=pos).astype(np.float64)
        else:
            raise _NotFastPath
        pos += length
    return name, width, values


def _decode_with_protobuf(data: bytes | memoryview) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    msg = protobuf_class().FromString(bytes(data))
    ts = np.asarray(msg.timestamp_ns, dtype=np.int64)
    fields = {}
    for f in msg.fields:
        values = np.asarray(f.values, dtype=np.float64)
        fields[f.name] = values.reshape(len(ts), f.width) if f.width else values.reshape(len(ts), 0)
    return ts, fields

"""CDR messages decoded as columns agree with rosbags' decoder field for field, and give up (None) whenever
the messages do not share one layout."""

from __future__ import annotations

import numpy as np
import pytest

from dyna_resources.sources.cdr_columns import LayoutError, decode_columns, layout

from .bags import ACTION_TYPE, typestore

TS = typestore()
M = TS.types


def header(k: int, frame_id: str = "base"):
    return M["std_msgs/msg/Header"](
        stamp=M["builtin_interfaces/msg/Time"](sec=1000 + k, nanosec=7 * k), frame_id=frame_id
    )


def cdr(msgs, msgtype):
    return [bytes(TS.serialize_cdr(m, msgtype)) for m in msgs]


def test_joint_states_with_an_empty_sequence_decode_as_rosbags_decodes_them():
    rng = np.random.default_rng(1)
    js = M["sensor_msgs/msg/JointState"]
    msgs = [
        js(header=header(k), name=["a", "bb", "ccc"], position=rng.standard_normal(3), velocity=rng.standard_normal(3),
           effort=np.zeros(0))
        for k in range(50)
    ]  # fmt: skip
    cols = decode_columns(TS.fielddefs, js.__msgtype__, cdr(msgs, js.__msgtype__))
    assert cols is not None
    assert np.array_equal(cols["position"], np.stack([m.position for m in msgs]))
    assert np.array_equal(cols["velocity"], np.stack([m.velocity for m in msgs]))
    assert cols["effort"].shape == (50, 0)
    assert cols["header.stamp.sec"].tolist() == [1000 + k for k in range(50)]
    assert cols["header.stamp.nanosec"].tolist() == [7 * k for k in range(50)]


def test_a_custom_type_with_a_fixed_array_and_a_scalar_after_it():
    action = M[ACTION_TYPE]
    msgs = [action(header=header(k, "b"), joints=np.arange(6.0) + k, gripper=float(k % 2)) for k in range(9)]
    cols = decode_columns(TS.fielddefs, ACTION_TYPE, cdr(msgs, ACTION_TYPE))
    assert cols is not None
    assert np.array_equal(cols["joints"], np.stack([m.joints for m in msgs]))
    assert cols["gripper"].tolist() == [float(k % 2) for k in range(9)]


def test_float64_multi_array_and_every_alignment():
    """An odd-length string before 8-byte data: the padding CDR inserts is where rosbags puts it."""
    arr, dim = M["std_msgs/msg/Float64MultiArray"], M["std_msgs/msg/MultiArrayDimension"]
    layout_t = M["std_msgs/msg/MultiArrayLayout"]
    msgs = [
        arr(layout=layout_t(dim=[dim(label="xyz", size=5, stride=5)], data_offset=3), data=np.linspace(k, k + 1, 5))
        for k in range(4)
    ]
    payloads = cdr(msgs, arr.__msgtype__)
    cols = decode_columns(TS.fielddefs, arr.__msgtype__, payloads)
    assert cols is not None and np.array_equal(cols["data"], np.stack([m.data for m in msgs]))
    assert cols["layout.data_offset"].tolist() == [3] * 4
    assert cols["layout.dim[0].size"].tolist() == [5] * 4
    assert layout(TS.fielddefs, arr.__msgtype__, payloads[0]).size == len(payloads[0])


def test_messages_of_different_layouts_are_left_to_rosbags():
    js = M["sensor_msgs/msg/JointState"]
    # equal lengths, but the name strings split differently: the length words disagree
    a = js(header=header(0), name=["ab", "c"], position=np.zeros(2), velocity=np.zeros(0), effort=np.zeros(0))
    b = js(header=header(1), name=["a", "bc"], position=np.zeros(2), velocity=np.zeros(0), effort=np.zeros(0))
    payloads = cdr([a, b], js.__msgtype__)
    assert len(payloads[0]) == len(payloads[1])
    assert decode_columns(TS.fielddefs, js.__msgtype__, payloads) is None
    c = js(header=header(2), name=["ab", "c", "d"], position=np.zeros(3), velocity=np.zeros(0), effort=np.zeros(0))
    assert decode_columns(TS.fielddefs, js.__msgtype__, cdr([a, c], js.__msgtype__)) is None  # lengths differ
    assert decode_columns(TS.fielddefs, js.__msgtype__, []) is None


def test_a_cut_or_foreign_payload_is_a_layout_error():
    js = M["sensor_msgs/msg/JointState"]
    (good,) = cdr([js(header=header(0), name=["a"], position=np.ones(1), velocity=np.ones(1), effort=np.ones(1))],
                  js.__msgtype__)  # fmt: skip
    with pytest.raises(LayoutError, match="past the end"):
        layout(TS.fielddefs, js.__msgtype__, good[:-4])
    with pytest.raises(LayoutError, match="little-endian"):
        layout(TS.fielddefs, js.__msgtype__, b"\x00\x00\x00\x00" + good[4:])  # big-endian CDR
    assert decode_columns(TS.fielddefs, js.__msgtype__, [good[:-4]]) is None

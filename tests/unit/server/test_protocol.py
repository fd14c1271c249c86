"""One tensor decoder for both directions (modelserver.protocol.decode_tensor): a request's inputs are
checked strictly against their datatype, a response's outputs (the shadow mirror reads them) leniently;
both read JSON data and Triton's binary tensor data the same way."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from modelserver.errors import InvalidInput
from modelserver.models.base import TensorSpec
from modelserver.protocol import decode_request, decode_response

SPECS = {"text": TensorSpec("text", "BYTES", [-1]), "ids": TensorSpec("ids", "INT64", [-1, -1])}


def request(*inputs: dict, binary: bytes = b"") -> tuple[bytes, str | None]:
    header = orjson.dumps({"inputs": list(inputs)})
    return header + binary, (str(len(header)) if binary else None)


def test_bytes_stay_strings_in_a_request_and_become_bytes_in_a_response() -> None:
    body, hl = request({"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "é"]})
    assert decode_request(body, hl, SPECS).inputs["text"].tolist() == ["a", "é"]
    out = decode_response(
        orjson.dumps({"outputs": [{"name": "t", "datatype": "BYTES", "shape": [2], "data": ["a", "é"]}]}),
        None,
    )
    assert out["t"].tolist() == [b"a", "é".encode()]


def test_binary_tensors_are_read_alike_in_both_directions() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    texts = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"c"))
    raw = ids.astype("<i8").tobytes() + texts
    params = ({"binary_data_size": ids.nbytes}, {"binary_data_size": len(texts)})
    tensors = [
        {"name": "ids", "datatype": "INT64", "shape": [2, 3], "parameters": params[0]},
        {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": params[1]},
    ]
    body, hl = request(*tensors, binary=raw)
    req = decode_request(body, hl, SPECS)
    header = orjson.dumps({"outputs": tensors})
    resp = decode_response(header + raw, str(len(header)))
    for got in (req.inputs, resp):
        assert np.array_equal(got["ids"], ids) and got["text"].tolist() == ["ab", "c"]


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (
            {"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2.5]},
            "INT64 data must be integers",
        ),
        (
            {"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [1, True]},
            "INT64 data must be integers",
        ),
        ({"name": "text", "datatype": "BYTES", "shape": [1], "data": [3]}, "BYTES data must be strings"),
        (
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]},
            "1 values do not match shape [2]",
        ),
        ({"name": "text", "datatype": "BYTES", "shape": [1]}, "input 'text' has no 'data'"),
    ],
)
def test_a_request_tensor_of_the_wrong_kind_is_refused_by_name(tensor: dict, message: str) -> None:
    body, hl = request(tensor)
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_request(body, hl, SPECS)


def test_binary_data_shorter_than_declared_is_refused_in_both_directions() -> None:
    t = {"name": "ids", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 16}}
    body, hl = request(t, binary=b"\0" * 8)
    with pytest.raises(InvalidInput, match="input 'ids': binary data is shorter than binary_data_size"):
        decode_request(body, hl, SPECS)
    header = orjson.dumps({"outputs": [t]})
    with pytest.raises(InvalidInput, match="output 'ids': binary data is shorter than binary_data_size"):
        decode_response(header + b"\0" * 8, str(len(header)))

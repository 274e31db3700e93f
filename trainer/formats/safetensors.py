"""Reads a .safetensors file (Hugging Face's tensor format) into NumPy arrays, and writes
float32 ones, without torch.

The format: an 8-byte little-endian header size n, n bytes of JSON mapping each tensor's
name to its dtype, shape and [begin, end) byte offsets in the data that follows (and an
optional "__metadata__" entry). Read here rather than with the `safetensors` package so
that a converter needs no package beyond the project's, reads bfloat16 (which NumPy lacks)
as float32, and names the file and the tensor in every error: a file cut short, offsets
outside it, a shape that does not match its bytes.
"""

import json
import os
from typing import Dict

import numpy as np



class SafetensorsError(ValueError):
    """A file that is not a whole safetensors file; the message is one line naming it."""


# safetensors dtype -> (NumPy dtype of the stored bytes, bytes per element).
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}


def load(path: str) -> Dict[str, np.ndarray]:
    """{name: array} of every tensor in `path`; floating-point tensors as float32.

    Raises:
      SafetensorsError: the file is cut short or is not a safetensors file.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path} is cut short ({size} bytes): not a whole "
                                  "safetensors file")
        header_size = int.from_bytes(head, "little")
        if header_size > size - 8:
            raise SafetensorsError(f"{path} is cut short or not a safetensors file (its header "
                                  f"needs {header_size} bytes, the file has {size})")
        try:
            header = json.loads(f.read(header_size))
        except ValueError:
            raise SafetensorsError(f"{path} has a damaged header: not a safetensors file") from None
        data = f.read()
    header.pop("__metadata__", None)
    tensors = {}
    for name, entry in header.items():
        tensors[name] = _tensor(path, name, entry, data)
    return tensors


def _tensor(path: str, name: str, entry: dict, data: bytes) -> np.ndarray:
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise SafetensorsError(f"{path}: tensor {name} has a damaged header entry") from None
    if dtype not in _DTYPES:
        raise SafetensorsError(f"{path}: tensor {name} has dtype {dtype}, which a model's "
                              "weights never have")
    if end > len(data):
        raise SafetensorsError(f"{path} is cut short: tensor {name} ends at byte {end} of the "
                              f"data, which has {len(data)}")
    stored = np.dtype(_DTYPES[dtype])
    count = int(np.prod(shape)) if shape else 1
    if end - begin != count * stored.itemsize:
        raise SafetensorsError(f"{path}: tensor {name} of shape {shape} and dtype {dtype} "
                              f"has {end - begin} bytes")
    array = np.frombuffer(data, stored, count, begin).reshape(shape)
    if dtype == "BF16":  # the high half of a float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32) if array.dtype.kind == "f" else array.copy()


def save(path: str, tensors: Dict[str, np.ndarray]):
    """Writes `tensors` {name: array} to `path` as float32, in name order, as torch's
    safetensors files are (metadata {"format": "pt"}, the header padded with spaces to a
    multiple of 8 bytes)."""
    header, offset, arrays = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for array in arrays:
            f.write(array.tobytes())

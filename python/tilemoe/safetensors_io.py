"""safetensors files without the safetensors package (Debian 12 does not ship it): read a header,
read tensors into numpy, write numpy arrays or torch tensors."""
import json
import struct

import numpy as np

# bf16 is read as its uint16 bits (numpy has no bfloat16); see tilemoe.bf16.
_NUMPY_OF = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "I64": np.int64,
             "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def read_header(path):
    """The JSON header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def read_tensors(path, bf16_as_float32=True):
    """{name: numpy array}; BF16 becomes float32 (or stays uint16 bits with bf16_as_float32=False)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=_NUMPY_OF[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16" and bf16_as_float32:
            a = (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        out[name] = a.copy()
    return out


def _dtype_and_bytes(value):
    if hasattr(value, "detach"):  # a torch tensor
        import torch
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return "BF16", list(t.shape), t.view(torch.int16).numpy().tobytes()
        value = t.numpy()
    a = np.ascontiguousarray(value)
    names = {np.dtype(v): k for k, v in _NUMPY_OF.items() if k != "BF16"}
    if a.dtype not in names:
        raise TypeError(f"safetensors: cannot store dtype {a.dtype}")
    return names[a.dtype], list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def write_tensors(path, tensors, metadata=None):
    """Writes {name: numpy array or torch tensor} (torch.bfloat16 stored as BF16), names sorted."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, blob = _dtype_and_bytes(tensors[name])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)

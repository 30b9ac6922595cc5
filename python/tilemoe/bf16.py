"""bfloat16 for numpy callers, which have no such dtype: uint16 arrays of the raw bits, rounded to
nearest even as PyTorch rounds (torch users pass torch.bfloat16 tensors instead)."""
import numpy as np


def float32_to_bf16(x):
    """float array -> uint16 array of bfloat16 bits (NaN stays NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    if nan.any():
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def bf16_to_float32(bits):
    """uint16 array of bfloat16 bits -> float32 array."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

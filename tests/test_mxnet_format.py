"""twobit and onebit payloads are MXNet's bytes: golden vectors written from MXNet's own rules.

The rules (src/kvstore/gradient_compression-inl.h, quantize_2bit and quantize_1bit), restated
here in plain Python and NumPy float32, independent of gctestbed's packing code:

- 2-bit: element i's code goes into byte i // 4 of the payload; residual[i] += grad[i]; if
  residual >= tau, OR the mask (0xc0, 0x30, 0x0c, 0x03)[i % 4] and residual -= tau; elif
  residual <= -tau, OR (0x80, 0x20, 0x08, 0x02)[i % 4] and residual -= -tau. 16 codes per 4 bytes.
- 1-bit: element i's bit goes into byte i // 8; residual[i] += grad[i]; if residual > threshold
  (strict), OR 0x80 >> (i % 8) and residual -= scale; else residual += scale. 32 codes per 4 bytes.

Bytes are compared in memory order, the payload's size a whole number of 4-byte words.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gctestbed import compress
from gctestbed.compress.base import Bucket, Payload

POS = (0xC0, 0x30, 0x0C, 0x03)
NEG = (0x80, 0x20, 0x08, 0x02)


def mxnet_2bit(grad: np.ndarray, residual: np.ndarray, tau: float) -> bytes:
    """MXNet's quantize_2bit, element by element; updates ``residual`` in place."""
    out = bytearray(4 * ((grad.size + 15) // 16))
    t = np.float32(tau)
    for i in range(grad.size):
        residual[i] = np.float32(residual[i] + grad[i])
        if residual[i] >= t:
            out[i // 4] |= POS[i % 4]
            residual[i] = np.float32(residual[i] - t)
        elif residual[i] <= -t:
            out[i // 4] |= NEG[i % 4]
            residual[i] = np.float32(residual[i] - (-t))
    return bytes(out)


def mxnet_1bit(grad: np.ndarray, residual: np.ndarray, threshold: float, scale: float) -> bytes:
    """MXNet's quantize_1bit (its scale is 1; gctestbed's is an option), element by element."""
    out = bytearray(4 * ((grad.size + 31) // 32))
    th, s = np.float32(threshold), np.float32(scale)
    for i in range(grad.size):
        residual[i] = np.float32(residual[i] + grad[i])
        if residual[i] > th:
            out[i // 8] |= 0x80 >> (i % 8)
            residual[i] = np.float32(residual[i] - s)
        else:
            residual[i] = np.float32(residual[i] + s)
    return bytes(out)


def pattern(n: int) -> np.ndarray:
    """+0.75, -0.6, 0.1, +0.75, ...: above, below and between the thresholds used below."""
    return np.array([(0.75, -0.6, 0.1)[i % 3] for i in range(n)], dtype=np.float32)


# Written by hand from the rules, for the pattern: 2-bit codes 11 10 00 | 11 10 00 ... (tau 0.5),
# 1-bit 1 0 1 | 1 0 1 ... (threshold 0).
HAND_2BIT = {1: "c0000000", 15: "e38e38e0", 16: "e38e38e3", 17: "e38e38e380000000"}
HAND_1BIT = {1: "80000000", 15: "b6da0000", 16: "b6db0000", 17: "b6db0000"}

MODES = ["torch", pytest.param("native", marks=pytest.mark.compiler),
         pytest.param("cuda", marks=pytest.mark.cuda)]


def payload_bytes(method: str, mode: str, grads: list[np.ndarray]) -> list[bytes]:
    """The payload of each step's gradient, as training makes it (memories carried over)."""
    name, options = compress.resolve(method)
    c = compress.create(name, options, kernels="torch" if mode == "torch" else "native")
    device = "cuda" if mode == "cuda" else "cpu"
    if mode != "torch":
        assert c.native(torch.empty(0, device=device)) is not None, f"no native kernels for {device}"
    out = []
    for step, g in enumerate(grads):
        bucket = Bucket(key=0, shapes=[torch.Size([g.size])], step=step)
        payload = c.encode(torch.from_numpy(g).to(device), bucket)
        (words,) = payload.gather
        assert words.dtype == torch.int32
        out.append(words.cpu().numpy().tobytes())
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", sorted(HAND_2BIT))
def test_twobit_small_sizes_match_bytes_written_by_hand(mode, n):
    assert payload_bytes("twobit:threshold=0.5", mode, [pattern(n)]) == [bytes.fromhex(HAND_2BIT[n])]
    assert mxnet_2bit(pattern(n), np.zeros(n, np.float32), 0.5) == bytes.fromhex(HAND_2BIT[n])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", sorted(HAND_1BIT))
def test_onebit_small_sizes_match_bytes_written_by_hand(mode, n):
    assert payload_bytes("onebit:threshold=0,scale=1", mode, [pattern(n)]) == [bytes.fromhex(HAND_1BIT[n])]
    assert mxnet_1bit(pattern(n), np.zeros(n, np.float32), 0.0, 1.0) == bytes.fromhex(HAND_1BIT[n])


def random_steps(n: int, steps: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    grads = [rng.normal(0, 1e-3, n).astype(np.float32) for _ in range(steps)]
    edge = np.array([1e-3, -1e-3, 0.0, -0.0, 2e-3, -2e-3], np.float32)   # on the thresholds: >= against >
    grads[0][:6] = edge[:n]
    return grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 4099, 70_001])
def test_twobit_payloads_are_mxnets_bytes_step_after_step(mode, n):
    grads = random_steps(n)
    residual = np.zeros(n, np.float32)
    expected = [mxnet_2bit(g, residual, 1e-3) for g in grads]
    assert payload_bytes("twobit:threshold=0.001", mode, grads) == expected


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 4099, 70_001])
def test_onebit_payloads_are_mxnets_bytes_step_after_step(mode, n):
    grads = random_steps(n)
    residual = np.zeros(n, np.float32)
    expected = [mxnet_1bit(g, residual, 0.0, 1e-3) for g in grads]
    assert payload_bytes("onebit:threshold=0,scale=0.001", mode, grads) == expected


@pytest.mark.parametrize("mode", MODES)
def test_mxnet_bytes_decode_to_mxnets_values(mode):
    """Decoding follows MXNet's dequantize: 11 -> +tau, 10 -> -tau, else 0; 1 -> +scale, 0 -> -scale."""
    name, options = compress.resolve("twobit:threshold=0.5")
    c = compress.create(name, options, kernels="torch" if mode == "torch" else "native")
    device = "cuda" if mode == "cuda" else "cpu"
    words = torch.frombuffer(bytearray(bytes.fromhex("e38e38e380000000")), dtype=torch.int32).to(device)
    bucket = Bucket(key=0, shapes=[torch.Size([17])])
    out = c.decompress(Payload(gather=[words], gathered=[[words]]), bucket, 17)
    assert out.cpu().tolist() == [float(v) for v in np.where(pattern(17) > 0.5, 0.5, np.where(pattern(17) < -0.5, -0.5, 0))]
    name, options = compress.resolve("onebit:threshold=0,scale=1")
    c = compress.create(name, options, kernels="torch" if mode == "torch" else "native")
    words = torch.frombuffer(bytearray(bytes.fromhex("b6db0000")), dtype=torch.int32).to(device)
    out = c.decompress(Payload(gather=[words], gathered=[[words]]), bucket, 17)
    assert out.cpu().tolist() == [1.0 if v > 0 else -1.0 for v in pattern(17)]

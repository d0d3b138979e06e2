"""An independent GGUF v3 reader / writer and ggml block dequantizers in numpy, written from the format specification
(GGUF: header, typed metadata, tensor table, aligned data; ggml-common.h block layouts). Shares no code with flashkv.

Block layouts (all little-endian; fp16 = IEEE binary16):
  Q4_0 (32 values, 18 B)  d:f16, qs[16]   value j = low nibble of qs[j], value j+16 = high nibble; x = d*(q-8)
  Q4_1 (32, 20 B)         d:f16, m:f16, qs[16];                                             x = d*q + m
  Q5_0 (32, 22 B)         d:f16, qh:u32 (bit j = 5th bit of value j), qs[16];               x = d*(q-16)
  Q5_1 (32, 24 B)         d:f16, m:f16, qh:u32, qs[16];                                     x = d*q + m
  Q8_0 (32, 34 B)         d:f16, qs:int8[32];                                               x = d*q
  Q4_K (256, 144 B)       d:f16, dmin:f16, scales[12] (8 x 6-bit scale/min), qs[128]        x = d*sc*q - dmin*mn
  Q5_K (256, 176 B)       d:f16, dmin:f16, scales[12], qh[32], qs[128]                      x = d*sc*q - dmin*mn
  Q6_K (256, 210 B)       ql[128], qh[64], scales:int8[16], d:f16                           x = d*sc*(q-32)
Every product d*q (and d*sc, d*sc*q in the K formats) is exact in float32, so computing the formula in float32 with one
final rounding gives the float32 nearest to the exact value; that is what the functions below do (numpy float32 ops
are IEEE correctly rounded).
"""
import struct

import numpy as np

GGML = {  # id: (name, values per block, bytes per block)
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    30: ("BF16", 1, 2),
}
TYPE_ID = {v[0]: k for k, v in GGML.items()}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


# ---------------------------------------------------------------------------------------------------------------- read
class GGUF:
    def __init__(self, path):
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")
        self.off = 0
        assert bytes(self.raw[:4]) == b"GGUF", "not a GGUF file"
        self.off = 4
        self.version = self._take("I")
        n_tensors, n_kv = self._take("Q"), self._take("Q")
        self.meta = {}
        for _ in range(n_kv):
            k = self._string()
            self.meta[k] = self._value(self._take("I"))
        self.infos = {}
        for _ in range(n_tensors):
            name = self._string()
            nd = self._take("I")
            ne = [self._take("Q") for _ in range(nd)]
            t, o = self._take("I"), self._take("Q")
            self.infos[name] = (ne, t, o)
        align = self.meta.get("general.alignment", 32)
        self.data_start = (self.off + align - 1) // align * align

    def _take(self, fmt):
        n = struct.calcsize("<" + fmt)
        v = struct.unpack("<" + fmt, bytes(self.raw[self.off:self.off + n]))[0]
        self.off += n
        return v

    def _string(self):
        n = self._take("Q")
        s = bytes(self.raw[self.off:self.off + n]).decode("utf-8", "surrogateescape")
        self.off += n
        return s

    def _value(self, t):
        if t == 8:
            return self._string()
        if t == 9:
            et, n = self._take("I"), self._take("Q")
            if et in SCALAR and et != 7:
                fmt = SCALAR[et]
                size = struct.calcsize(fmt)
                a = np.frombuffer(bytes(self.raw[self.off:self.off + n * size]), dtype="<" + fmt).tolist()
                self.off += n * size
                return a
            return [self._value(et) for _ in range(n)]
        return self._take(SCALAR[t])

    def tensor(self, name):
        """float32 array shaped reversed(ne) (row-major: a [out, in] matrix for ne = [in, out])."""
        ne, t, o = self.infos[name]
        n = int(np.prod(ne))
        _, bv, bb = GGML[t]
        start = self.data_start + o
        raw = np.asarray(self.raw[start:start + n // bv * bb])
        return dequantize(t, raw, n).reshape(list(reversed(ne)))


# ---------------------------------------------------------------------------------------------------------- dequantize
def _f16(b, at):
    """fp16 field at byte `at` of each block row of b [nb, block_bytes] → float32 [nb, 1]."""
    return b[:, at:at + 2].copy().view("<f2").astype(np.float32)


def _nibbles32(qs):
    """qs [nb, 16] → codes [nb, 32]: low nibbles are values 0..15, high nibbles values 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def _high_bits32(qh):
    """qh [nb, 4] bytes (a little-endian u32) → [nb, 32] bit j of the word."""
    word = qh.copy().view("<u4").astype(np.uint64)  # [nb, 1]
    return ((word >> np.arange(32, dtype=np.uint64)) & 1).astype(np.int32)


def _scale_min_k4(s):
    """Q4_K / Q5_K 12-byte scales [nb, 12] → (scale [nb, 8], min [nb, 8]) 6-bit values."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), np.int32)
    mn = np.empty((s.shape[0], 8), np.int32)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def dequantize(t, raw, n):
    name, bv, bb = GGML[t]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if name == "F32":
        return raw.view("<f4").astype(np.float32)
    if name == "F16":
        return raw.view("<f2").astype(np.float32)
    if name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    b = raw.reshape(-1, bb)
    f32 = np.float32
    if name == "Q4_0":
        q = _nibbles32(b[:, 2:18])
        y = _f16(b, 0) * (q - 8).astype(f32)
    elif name == "Q4_1":
        q = _nibbles32(b[:, 4:20])
        y = _f16(b, 0) * q.astype(f32) + _f16(b, 2)
    elif name == "Q5_0":
        q = _nibbles32(b[:, 6:22]) | (_high_bits32(b[:, 2:6]) << 4)
        y = _f16(b, 0) * (q - 16).astype(f32)
    elif name == "Q5_1":
        q = _nibbles32(b[:, 8:24]) | (_high_bits32(b[:, 4:8]) << 4)
        y = _f16(b, 0) * q.astype(f32) + _f16(b, 2)
    elif name == "Q8_0":
        y = _f16(b, 0) * b[:, 2:34].view(np.int8).astype(f32)
    elif name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144] if name == "Q4_K" else b[:, 48:176]
        # 64-value chunk c = 32 bytes: low nibbles → sub-block 2c, high nibbles → sub-block 2c+1.
        chunks = qs.reshape(-1, 4, 32).astype(np.int32)
        q = np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 8, 32)  # [nb, sub-block, 32]
        if name == "Q5_K":
            qh = b[:, 16:48].astype(np.int32)  # bit s of byte l = 5th bit of value l of sub-block s
            q = q | (((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4)
        y = (d * sc.astype(f32))[:, :, None] * q.astype(f32) - (dmin * mn.astype(f32))[:, :, None]
    elif name == "Q6_K":
        ql = b[:, 0:128].reshape(-1, 2, 64).astype(np.int32)
        qh = b[:, 128:192].reshape(-1, 2, 32).astype(np.int32)
        sc = b[:, 192:208].view(np.int8).astype(f32).reshape(-1, 16)
        d = _f16(b, 208)
        # Within each half of 128: value 32*k + l (k = 0..3, l < 32) takes 4 low bits from ql[(k&1)*32 + l] (low nibble
        # for k < 2, high nibble for k >= 2) and 2 high bits from qh[l] >> 2k.
        low = np.stack([ql[:, :, 0:32] & 0x0F, ql[:, :, 32:64] & 0x0F, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], axis=2)
        high = np.stack([(qh >> (2 * k)) & 3 for k in range(4)], axis=2)
        q = (low | (high << 4)) - 32  # [nb, half, k, l]
        q = q.reshape(-1, 256).astype(f32)
        scale = np.repeat(sc, 16, axis=1)  # value v uses scale v // 16
        y = (d * scale) * q
    else:
        raise ValueError(f"unsupported type {t}")
    return np.asarray(y, dtype=np.float32).reshape(-1)[:n]


# ---------------------------------------------------------------------------------------------------------------- write
def write_gguf(path, metadata, tensors, alignment=32):
    """metadata: list of (key, type_id, value) (type 9 = array: value is (elem_type, list)); tensors: list of
    (name, ne, ggml_type_id, raw bytes)."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), len(metadata))

    def s(x):
        b = x.encode("utf-8") if isinstance(x, str) else x
        return struct.pack("<Q", len(b)) + b

    def val(t, v):
        if t == 8:
            return s(v)
        if t == 9:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(val(et, i) for i in items)
        return struct.pack("<" + SCALAR[t], v)

    for k, t, v in metadata:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    offsets, off = [], 0
    for name, ne, t, raw in tensors:
        offsets.append(off)
        off += (len(raw) + alignment - 1) // alignment * alignment
    for (name, ne, t, raw), o in zip(tensors, offsets):
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, o)
    out += b"\0" * (-len(out) % alignment)
    for name, ne, t, raw in tensors:
        out += raw + b"\0" * (-len(raw) % alignment)
    with open(path, "wb") as f:
        f.write(out)


def random_blocks(rng, t, n_values, scale=1.0):
    """Random raw bytes for n_values values of type t whose fp16 scales are finite (so every value is finite); `scale`
    multiplies the scale ranges (and the float types' standard deviation)."""
    name, bv, bb = GGML[t]
    nb = n_values // bv
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)

    def put_f16(col, lo, hi):
        v = rng.uniform(lo * scale, hi * scale, size=nb).astype(np.float16)
        raw[:, col:col + 2] = v.view(np.uint8).reshape(nb, 2)

    if name in ("F32",):
        return (scale * rng.standard_normal(n_values)).astype("<f4").tobytes()
    if name == "F16":
        return (scale * rng.standard_normal(n_values)).astype("<f2").tobytes()
    if name == "BF16":
        return ((scale * rng.standard_normal(n_values)).astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    if name in ("Q4_0", "Q5_0", "Q8_0"):
        put_f16(0, -0.1, 0.1)
    elif name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
        put_f16(0, -0.1, 0.1)
        put_f16(2, -0.5, 0.5)
    elif name == "Q6_K":
        put_f16(208, -0.01, 0.01)
    return raw.tobytes()

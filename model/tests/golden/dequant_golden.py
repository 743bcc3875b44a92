#!/usr/bin/env python3
"""Golden data for den-model's tests, from an independent implementation: gguf-py.

    .venv/bin/python model/tests/golden/dequant_golden.py [MODELS_DIR]

MODELS_DIR defaults to $DEN_TEST_MODELS (see tests/fetch-models). Writes dequant.json
next to this script. Everything in it comes from `gguf.GGUFReader` (metadata, tensor table)
and `gguf.quants.dequantize` / `gguf.quants.quantize` (values) and numpy/hashlib; nothing
is computed by den's code.

- models: for each real file, its sha256, layout, every metadata entry (scalars by value,
  long strings and arrays by a sha256 of a canonical encoding, described below), the
  weights digest (den-model's `weights_digest` scheme, recomputed here with hashlib), and
  for each ggml type in the file one or two real tensors: the first 512 dequantized
  values, four windows of 128 values spread over the tensor, the float64 sum and sum of
  squares, and a sha256 of all the dequantized values (little-endian f32).
- synthetic: for types the files lack (F16, BF16, Q4_0) and, as extra coverage, random raw
  blocks of every supported type: the raw bytes (hex) and the dequantized values. F16 and
  BF16 are exhaustive: every one of the 65536 bit patterns, checked by sha256.

Values are stored as hex of little-endian f32 bit patterns so that the comparison can be
exact (bitwise) without decimal round-trips.

Canonical encodings (all little-endian): an array of strings hashes as, per element, a u64
byte length then the UTF-8 bytes; an array of numbers or bools as its elements' bytes.
"""

import hashlib
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf.quants import dequantize, quantize

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dequant.json")

MODELS = {
    "smollm2-135m-instruct-q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "gemma-3-270m-q4_k_m.gguf": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}
# Types picked twice (first and last tensor of the type in table order); F32 once.
MAX_ELEMENTS = 32 * 1024 * 1024  # skip Gemma's 167M-element embedding
FIRST = 512
WINDOWS = 4
WINDOW = 128
LONG_STRING = 200
DIGEST_DOMAIN = b"den-model weights-digest v1\0"

SCALAR_NAMES = {
    V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
    V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string",
    V.ARRAY: "array", V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64",
}
NUMPY = {
    V.UINT8: "<u1", V.INT8: "<i1", V.UINT16: "<u2", V.INT16: "<i2", V.UINT32: "<u4",
    V.INT32: "<i4", V.FLOAT32: "<f4", V.BOOL: "<u1", V.UINT64: "<u8", V.INT64: "<i8",
    V.FLOAT64: "<f8",
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def f32_hex(values):
    return np.ascontiguousarray(values, dtype="<f4").tobytes().hex()


def f32_sha(values):
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<f4").tobytes()).hexdigest()


def metadata_entry(field):
    types = field.types
    ty = types[0]
    value = field.contents()
    if ty == V.ARRAY:
        elem = types[1] if len(types) > 1 else None
        if elem == V.ARRAY:
            raise SystemExit(f"{field.name}: nested arrays: not expected in these files")
        h = hashlib.sha256()
        if elem == V.STRING:
            for s in value:
                b = s.encode("utf-8")
                h.update(len(b).to_bytes(8, "little"))
                h.update(b)
        else:
            h.update(np.asarray(value, dtype=NUMPY[elem]).tobytes())
        return {"type": "array", "element_type": SCALAR_NAMES[elem], "len": len(value),
                "sha256": h.hexdigest()}
    name = SCALAR_NAMES[ty]
    if ty == V.STRING:
        b = value.encode("utf-8")
        if len(b) > LONG_STRING:
            return {"type": name, "len": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        return {"type": name, "value": value}
    if ty == V.FLOAT32:
        # The f32, widened exactly to a float64 (JSON numbers round-trip float64 exactly).
        return {"type": name, "value": float(np.float32(value))}
    if ty == V.BOOL:
        return {"type": name, "value": bool(value)}
    if ty == V.FLOAT64:
        return {"type": name, "value": float(value)}
    return {"type": name, "value": int(value)}


def weights_digest(path, reader):
    """den-model's weights_digest, from gguf-py's tensor table and the raw file bytes."""
    h = hashlib.sha256()
    h.update(DIGEST_DOMAIN)
    tensors = reader.tensors
    h.update(len(tensors).to_bytes(8, "little"))
    for t in tensors:
        name = t.name.encode("utf-8")
        h.update(len(name).to_bytes(8, "little"))
        h.update(name)
        dims = [int(d) for d in t.shape]
        h.update(len(dims).to_bytes(4, "little"))
        for d in dims:
            h.update(d.to_bytes(8, "little"))
        h.update(int(t.tensor_type).to_bytes(4, "little"))
        h.update(int(t.n_bytes).to_bytes(8, "little"))
    with open(path, "rb") as f:
        for t in tensors:
            f.seek(int(t.data_offset))
            left = int(t.n_bytes)
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    raise SystemExit(f"{path}: short read in {t.name}")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def tensor_entry(t):
    values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
    n = values.size
    assert n == int(t.n_elements), (t.name, n, t.n_elements)
    windows = []
    for k in range(WINDOWS):
        start = min(n * (2 * k + 1) // (2 * WINDOWS) + 7 * k, n - WINDOW)
        windows.append({"offset": int(start), "f32_hex": f32_hex(values[start:start + WINDOW])})
    wide = values.astype(np.float64)
    return {
        "name": t.name,
        "type": t.tensor_type.name,
        "type_id": int(t.tensor_type),
        "dims": [int(d) for d in t.shape],
        "n_elements": n,
        "n_bytes": int(t.n_bytes),
        "file_offset": int(t.data_offset),
        "first_f32_hex": f32_hex(values[:FIRST]),
        "windows": windows,
        "sum": float(np.sum(wide)),
        "sum_sq": float(np.sum(wide * wide)),
        "sum_abs": float(np.sum(np.abs(wide))),
        "f32_sha256": f32_sha(values),
    }


def model_entry(models_dir, file, want_sha):
    path = os.path.join(models_dir, file)
    sha = sha256_file(path)
    if sha != want_sha:
        raise SystemExit(f"{path}: sha256 {sha}, expected {want_sha}: run tests/fetch-models")
    r = gguf.GGUFReader(path)
    metadata = {k: metadata_entry(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    by_type = {}
    for t in r.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    picks = []
    for ty in sorted(by_type):
        small = [t for t in by_type[ty] if int(t.n_elements) <= MAX_ELEMENTS]
        chosen = small[:1] if ty == "F32" else ([small[0], small[-1]] if len(small) > 1 else small)
        picks += [tensor_entry(t) for t in chosen]
    return {
        "file": file,
        "sha256": sha,
        "version": int(r.fields["GGUF.version"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "tensor_count": len(r.tensors),
        "types": {ty: len(ts) for ty, ts in sorted(by_type.items())},
        "metadata": metadata,
        "weights_digest": weights_digest(path, r),
        "tensors": picks,
    }


def synthetic_entry(ty, description, raw, n_elements, values_hex=True):
    values = np.asarray(dequantize(np.frombuffer(raw, dtype=np.uint8), ty), dtype=np.float32).reshape(-1)
    assert values.size == n_elements, (ty, values.size, n_elements)
    entry = {"type": ty.name, "description": description, "n_elements": n_elements}
    if values_hex:
        entry["raw_hex"] = raw.hex()
        entry["f32_hex"] = f32_hex(values)
    else:
        entry["raw"] = "u16 0..=65535, little-endian"
    entry["f32_sha256"] = f32_sha(values)
    return entry


def random_blocks(rng, ty, n_blocks):
    """Random bytes, with the f16 scale fields set to finite values of varied magnitude,
    including the extremes (0, the smallest subnormal, the largest finite)."""
    block, size = gguf.GGML_QUANT_SIZES[ty]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    # f16 fields per type: byte offsets
    fields = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208]}[ty]
    special = [0.0, 2.0 ** -24, 65504.0, -1.0]
    for b in range(n_blocks):
        for i, off in enumerate(fields):
            if b < len(special) and i == 0:
                v = special[b]
            else:
                v = float(rng.uniform(-1, 1)) * 10.0 ** float(rng.integers(-6, 2))
            raw[b, off:off + 2] = np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)
    return raw.tobytes(), n_blocks * block


def synthetic():
    rng = np.random.default_rng(20240611)
    out = []
    every = np.arange(65536, dtype="<u2").tobytes()
    out.append(synthetic_entry(T.F16, "every f16 bit pattern", every, 65536, values_hex=False))
    out.append(synthetic_entry(T.BF16, "every bf16 bit pattern", every, 65536, values_hex=False))
    # Q4_0 from gguf-py's own quantizer on a deterministic signal.
    x = (np.sin(np.arange(8 * 32, dtype=np.float64) * 0.37) * np.linspace(0.01, 3, 8 * 32)).astype(np.float32)
    x = x.reshape(2, 128)
    q = quantize(x, T.Q4_0)
    out.append(synthetic_entry(T.Q4_0, "gguf.quants.quantize of a sine, 2 rows of 128", q.tobytes(), x.size))
    # BF16 from gguf-py's quantizer (round to nearest even), then back.
    y = (rng.standard_normal(256) * 3).astype(np.float32)
    out.append(synthetic_entry(T.BF16, "gguf.quants.quantize of 256 normals", quantize(y, T.BF16).tobytes(), 256))
    out.append(synthetic_entry(T.F16, "numpy float16 of 256 normals", y.astype("<f2").tobytes(), 256))
    out.append(synthetic_entry(T.F32, "256 normals", y.astype("<f4").tobytes(), 256))
    for ty, n_blocks in [(T.Q4_0, 8), (T.Q4_1, 8), (T.Q5_0, 8), (T.Q8_0, 8), (T.Q4_K, 2), (T.Q6_K, 2)]:
        raw, n = random_blocks(rng, ty, n_blocks)
        out.append(synthetic_entry(ty, f"{n_blocks} random blocks", raw, n))
    return out


def main():
    models_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DEN_TEST_MODELS")
    if not models_dir:
        raise SystemExit("dequant_golden.py: give MODELS_DIR or set DEN_TEST_MODELS (run tests/fetch-models)")
    import importlib.metadata as md
    golden = {
        "generator": "model/tests/golden/dequant_golden.py",
        "gguf_py_version": md.version("gguf"),
        "numpy_version": np.__version__,
        "models": [model_entry(models_dir, f, s) for f, s in MODELS.items()],
        "synthetic": synthetic(),
    }
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()

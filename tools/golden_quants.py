#!/usr/bin/env python3
"""Source of tests/data/quant_golden.json: blocks of every GGUF block type tokenfab added after
Q4_0/Q4_1/Q8_0, and their values as the `gguf` package's own dequantizer (gguf.quants) computes
them: an implementation written apart from ours (NumPy, whole arrays at once), with the layouts
of ggml's ggml-common.h. tests/kernels/test_kernels_formats.cpp checks that our scalar
dequantize_row gives the same float32 bits for every block.

Blocks: random bytes with the fp16 scales (d, and dmin or m) replaced by finite values of
either sign and magnitudes from 2^-14 to 2^3, so that the products of scales are not exact in
f32 and the order of the operations shows; then edge cases: zero and negative-zero scales, every
quantized byte 0x00 or 0xFF, subnormal scales, the largest finite fp16.

With --real FILE…, also blocks taken from real files of those types (the first, middle and last
block of a few tensors of each type in each file, e.g. the files tools/check_quant_files.sh makes
with llama-quantize from the embedded model): scales and levels as a real quantizer leaves them.
Each such case names the file (and its sha256), the tensor and the block.

Rerun (pins in tools/requirements-reference.txt, e.g. in a venv under build-venv/):
    python3 -m venv build-venv && build-venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    build-venv/bin/python tools/golden_quants.py [--out tests/data/quant_golden.json] \
        [--real build-llamacpp/quants/*.gguf]
The output is deterministic (fixed seed, files in the order given).
"""

import argparse
import base64
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES, GGUFReader
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
SEED = 20261205
RANDOM_BLOCKS = 8
REAL_TENSORS_PER_TYPE = 3  # per file: the first tensors of each type, in file order

# Byte offsets of each type's fp16 scale fields within its block (ggml-common.h):
# the rest of the block is quantized data (levels, packed sub-block scales, high bits).
FP16_FIELDS = {
    "Q5_0": {"d": 0},
    "Q5_1": {"d": 0, "m": 2},
    "Q2_K": {"d": 80, "dmin": 82},
    "Q3_K": {"d": 108},
    "Q4_K": {"d": 0, "dmin": 2},
    "Q5_K": {"d": 0, "dmin": 2},
    "Q6_K": {"d": 208},
    "IQ4_NL": {"d": 0},
    "IQ4_XS": {"d": 0},
}


def random_half(rng: np.random.Generator) -> int:
    """A finite fp16 of either sign, log-uniform in [2^-14, 2^3)."""
    value = np.float16(rng.choice([-1.0, 1.0]) * 2.0 ** rng.uniform(-14.0, 3.0))
    return int(np.array(value, dtype=np.float16).view(np.uint16))


def set_half(block: bytearray, offset: int, bits: int) -> None:
    block[offset : offset + 2] = int(bits).to_bytes(2, "little")


def cases_for(name: str, type_size: int, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    fields = FP16_FIELDS[name]

    def block(fill: int | None, halves: dict[str, int] | None) -> bytes:
        if fill is None:
            b = bytearray(rng.integers(0, 256, type_size, dtype=np.uint8).tobytes())
        else:
            b = bytearray([fill] * type_size)
        for field, offset in fields.items():
            set_half(b, offset, halves[field] if halves else random_half(rng))
        return bytes(b)

    def every(bits: int) -> dict[str, int]:
        return {field: bits for field in fields}

    def alternating(first: int, second: int) -> dict[str, int]:
        return {field: (first, second)[i % 2] for i, field in enumerate(fields)}

    cases = [(f"random {i}", block(None, None)) for i in range(RANDOM_BLOCKS)]
    cases += [
        ("zero scales", block(None, every(0x0000))),
        ("negative zero scales", block(None, every(0x8000))),
        ("every data byte 0xFF", block(0xFF, None)),
        ("every data byte 0x00", block(0x00, None)),
        # 2^-24 (smallest subnormal), −1023·2^-24 (largest subnormal, negative)
        ("subnormal scales", block(None, alternating(0x0001, 0x83FF))),
        # 65504 and −65504: the largest finite fp16
        ("largest scales", block(None, alternating(0x7BFF, 0xFBFF))),
    ]
    assert all(len(data) == type_size for _, data in cases)
    return cases


def real_cases(paths: list[Path]) -> dict[str, list[tuple[str, bytes]]]:
    """Blocks of the FP16_FIELDS types from real GGUF files: the first, middle and last block of
    the first REAL_TENSORS_PER_TYPE tensors of each type in each file."""
    found: dict[str, list[tuple[str, bytes]]] = {name: [] for name in FP16_FIELDS}
    for path in paths:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        taken: dict[str, int] = {}
        for tensor in GGUFReader(path).tensors:
            name = tensor.tensor_type.name
            if name not in FP16_FIELDS or taken.get(name, 0) >= REAL_TENSORS_PER_TYPE:
                continue
            taken[name] = taken.get(name, 0) + 1
            _, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
            raw = np.asarray(tensor.data, dtype=np.uint8).reshape(-1)
            n_blocks = raw.size // type_size
            for b in sorted({0, n_blocks // 2, n_blocks - 1}):
                data = raw[b * type_size : (b + 1) * type_size].tobytes()
                found[name].append((f"{path.name} (sha256 {sha[:16]}…) {tensor.name} block {b}",
                                    data))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/quant_golden.json")
    parser.add_argument("--real", type=Path, nargs="*", default=[],
                        help="GGUF files to take real blocks from")
    args = parser.parse_args()

    rng = np.random.default_rng(SEED)
    real = real_cases(args.real)
    types = {}
    for name in FP16_FIELDS:
        qtype = GGMLQuantizationType[name]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        cases = cases_for(name, type_size, rng) + real[name]
        blocks = np.frombuffer(b"".join(data for _, data in cases), dtype=np.uint8)
        values = dequantize(blocks.reshape(len(cases), type_size), qtype)
        assert values.dtype == np.float32 and values.shape == (len(cases), block_size)
        types[name] = {
            "block_bytes": type_size,
            "block_elements": block_size,
            "cases": [
                {
                    "name": case_name,
                    "block": data.hex(),
                    "values": base64.b64encode(values[i].astype("<f4").tobytes()).decode(),
                }
                for i, (case_name, data) in enumerate(cases)
            ],
        }

    doc = {
        "generated_by": f"tools/golden_quants.py with gguf {version('gguf')} "
        f"(gguf.quants.dequantize) and numpy {version('numpy')}",
        "format": "per type: cases of one block each; block: the block's bytes in hex; values: its "
        "dequantized float32s, little-endian, in base64",
        "seed": SEED,
        "real_files": [p.name for p in args.real],
        "types": types,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    total = sum(len(t["cases"]) for t in types.values())
    print(f"wrote {args.out}: {len(types)} types, {total} blocks")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Independent NumPy reference forward pass for SmolLM2-135M-Instruct (Llama architecture).

Reads the GGUF file with gguf.GGUFReader, dequantizes Q8_0 / Q4_1 itself from the raw block
bytes (cross-checked against gguf.quants.dequantize) and every other block type with
gguf.quants.dequantize (written apart from our code too), and runs a plain float64 forward pass with
no KV cache: every step recomputes the whole sequence. Nothing here shares code with the engine,
so agreement between the two is evidence that both are right.

Writes tests/data/forward_golden.json: prompt ids, the last position's logits (top 20 and the
first 256), the argmax at every prompt position, a greedy continuation, and the perplexity of
tests/data/perplexity_en.txt in one window.

    pip install -r tools/requirements-reference.txt
    python3 tools/reference_forward.py [--model PATH] [--out PATH]
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import gguf
from gguf import GGMLQuantizationType

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.expanduser("~/.cache/tokenfab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROMPT = "The capital of France is"
N_GREEDY = 8
PPL_WINDOW = 512
QK = 32  # elements per Q8_0 / Q4_1 block

_t0 = time.time()


def log(message):
    print(f"[reference_forward {time.time() - _t0:6.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Dequantization from raw block bytes. A row of n_in elements is n_in / 32 consecutive blocks.


def _f16_column(blocks, offset):
    """(n_blocks, 1) float64 from the little-endian f16 at byte `offset` of each block."""
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view("<f2").astype(np.float64)


def dequantize_q8_0(raw, n_rows, n_in):
    # Block (34 bytes): f16 d, then 32 int8 q. value = d * q.
    blocks = np.ascontiguousarray(raw).reshape(-1, 2 + QK)
    d = _f16_column(blocks, 0)
    q = blocks[:, 2:].view(np.int8).astype(np.float64)  # (n_blocks, 32)
    return (d * q).reshape(n_rows, n_in)


def dequantize_q4_1(raw, n_rows, n_in):
    # Block (20 bytes): f16 d, f16 m, 16 bytes; byte j holds element j in its low nibble and
    # element j + 16 in its high nibble. value = d * q + m, q in [0, 15].
    blocks = np.ascontiguousarray(raw).reshape(-1, 4 + QK // 2)
    d = _f16_column(blocks, 0)
    m = _f16_column(blocks, 2)
    packed = blocks[:, 4:]  # (n_blocks, 16) uint8
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float64)  # (n_blocks, 32)
    return (d * q + m).reshape(n_rows, n_in)


def load_tensor(tensor):
    """float64 array: (n_out, n_in) for a matrix stored with GGUF dims [n_in, n_out], or (n,)."""
    dims = [int(x) for x in tensor.shape]  # GGUF order: dims[0] is the contiguous one
    kind = tensor.tensor_type
    if kind == GGMLQuantizationType.F32:
        values = np.asarray(tensor.data, dtype=np.float64)
        return values.reshape(dims[::-1]) if len(dims) > 1 else values.reshape(dims[0])
    n_in, n_rows = dims[0], int(np.prod(dims[1:]))
    if kind == GGMLQuantizationType.Q8_0:
        mine = dequantize_q8_0(tensor.data, n_rows, n_in)
    elif kind == GGMLQuantizationType.Q4_1:
        mine = dequantize_q4_1(tensor.data, n_rows, n_in)
    else:  # the K-quants, Q5_0/Q5_1, IQ4_*, F16, BF16: gguf's own dequantizer
        return gguf.quants.dequantize(tensor.data, kind).reshape(n_rows, n_in).astype(np.float64)
    # Cross-check against gguf's own dequantizer (float32 arithmetic, hence the tolerance).
    theirs = gguf.quants.dequantize(tensor.data, kind).reshape(n_rows, n_in).astype(np.float64)
    scale = float(np.max(np.abs(theirs)))
    err = float(np.max(np.abs(mine - theirs)))
    assert err <= 1e-6 * scale, f"{tensor.name}: dequantization differs from gguf by {err}"
    return mine


# ---------------------------------------------------------------------------------------------
# Model


class Model:
    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        self.reader = reader

        def field(key):
            return reader.fields[key].contents()

        self.n_layer = int(field("llama.block_count"))
        self.dim = int(field("llama.embedding_length"))
        self.n_head = int(field("llama.attention.head_count"))
        self.n_kv_head = int(field("llama.attention.head_count_kv"))
        self.head_dim = self.dim // self.n_head
        self.rope_base = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        log(f"hparams: layers {self.n_layer}, dim {self.dim}, heads {self.n_head}/"
            f"{self.n_kv_head} kv, head_dim {self.head_dim}, rope base {self.rope_base}, "
            f"eps {self.eps}")

        # Each weight dequantized once and kept as float64 (about 1.2 GB in all).
        self.w = {}
        for i, tensor in enumerate(reader.tensors):
            self.w[tensor.name] = load_tensor(tensor)
            if i % 40 == 0:
                log(f"dequantized {i + 1}/{len(reader.tensors)} tensors ({tensor.name})")
        self.embd = self.w["token_embd.weight"]  # (vocab, dim); also the tied output
        self.output = self.w.get("output.weight", self.embd)
        log(f"weights ready: {len(self.w)} tensors, output "
            f"{'output.weight' if 'output.weight' in self.w else 'tied to token_embd.weight'}")

    def rms_norm(self, x, weight):
        # x: (T, dim)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x, positions):
        # x: (T, heads, head_dim). Adjacent pairs (x[2i], x[2i+1]) rotate by
        # pos * base^(-2i / head_dim) (llama.cpp's "normal" rope; GGUF Q/K rows are permuted for
        # exactly this pairing).
        half = self.head_dim // 2
        inv_freq = self.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)
        angle = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (T, half)
        cos = np.cos(angle)[:, None, :]
        sin = np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def attention(self, h, layer):
        # h: (T, dim) normed input. Returns (T, dim) before the residual.
        T = h.shape[0]
        p = f"blk.{layer}."
        q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.head_dim)
        k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv_head, self.head_dim)
        v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv_head, self.head_dim)
        positions = np.arange(T)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        group = self.n_head // self.n_kv_head
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (query, key): key after query
        out = np.empty((T, self.n_head, self.head_dim))
        for head in range(self.n_head):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T / math.sqrt(self.head_dim)  # (T, T)
            scores[future] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head, :] = probs @ v[:, kv, :]
        return out.reshape(T, self.dim) @ self.w[p + "attn_output.weight"].T

    def feed_forward(self, h, layer):
        p = f"blk.{layer}."
        gate = h @ self.w[p + "ffn_gate.weight"].T  # (T, ffn)
        up = h @ self.w[p + "ffn_up.weight"].T
        silu = gate / (1.0 + np.exp(-gate))
        return (silu * up) @ self.w[p + "ffn_down.weight"].T

    def forward(self, ids):
        """Logits (T, vocab) for token ids (T,), position i seeing tokens 0..i."""
        x = self.embd[np.asarray(ids)]  # (T, dim)
        for layer in range(self.n_layer):
            x = x + self.attention(self.rms_norm(x, self.w[f"blk.{layer}.attn_norm.weight"]), layer)
            x = x + self.feed_forward(self.rms_norm(x, self.w[f"blk.{layer}.ffn_norm.weight"]),
                                      layer)
        x = self.rms_norm(x, self.w["output_norm.weight"])
        return x @ self.output.T


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE rebuilt from the GGUF vocabulary and merges.


def build_tokenizer(reader):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    def strings(key):
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    types_field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert not reader.fields["tokenizer.ggml.add_bos_token"].contents()

    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    # "smollm" pre-tokenizer: every digit on its own, then GPT-2's byte-level split.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([t for t, kind in zip(tokens, types) if kind == 3])  # control
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    return tokenizer, eos


# ---------------------------------------------------------------------------------------------


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "tests/data/forward_golden.json"))
    parser.add_argument("--text", default=os.path.join(REPO_ROOT, "tests/data/perplexity_en.txt"))
    args = parser.parse_args()

    model_sha = sha256_of(args.model)
    if model_sha != EXPECTED_SHA256:
        raise SystemExit(f"{args.model}: sha256 {model_sha}, expected {EXPECTED_SHA256}")
    model = Model(args.model)
    tokenizer, eos = build_tokenizer(model.reader)

    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False).ids
    log(f"prompt {PROMPT!r} -> {prompt_ids}")
    logits = model.forward(prompt_ids)  # (T, vocab)
    last = logits[-1]
    top20 = np.argsort(-last, kind="stable")[:20]
    per_position_argmax = [int(i) for i in logits.argmax(axis=-1)]
    log("top 5 at the last position: " + ", ".join(
        f"{int(i)} {tokenizer.decode([int(i)])!r} {last[i]:.4f}" for i in top20[:5]))

    # Greedy continuation, recomputing the whole sequence each step.
    ids = list(prompt_ids)
    generated = []
    for step in range(N_GREEDY):
        next_id = int(model.forward(ids)[-1].argmax()) if step else int(last.argmax())
        generated.append(next_id)
        ids.append(next_id)
        log(f"greedy step {step + 1}/{N_GREEDY}: {next_id} {tokenizer.decode([next_id])!r}")
        if next_id == eos:
            break
    continuation = tokenizer.decode(generated, skip_special_tokens=False)
    log(f"continuation: {continuation!r}")

    # Perplexity of the English text: one window, no BOS, predicting token i+1 from tokens <= i.
    with open(args.text, encoding="utf-8") as f:
        text_ids = tokenizer.encode(f.read(), add_special_tokens=False).ids[:PPL_WINDOW]
    log(f"perplexity window: {len(text_ids)} tokens")
    logp = log_softmax(model.forward(text_ids)[:-1])  # (n - 1, vocab)
    nll = -logp[np.arange(len(text_ids) - 1), text_ids[1:]]
    ppl = float(math.exp(nll.mean()))
    log(f"perplexity {ppl:.4f}")

    golden = {
        "source": "tools/reference_forward.py (NumPy float64 reference, dequantized weights)",
        "model_sha256": model_sha,
        "prompt": PROMPT,
        "prompt_ids": [int(i) for i in prompt_ids],
        "last_logits_top20": [[int(i), float(last[i])] for i in top20],
        "last_logits_first256": [float(v) for v in last[:256]],
        "per_position_argmax": per_position_argmax,
        "greedy_continuation_ids": generated,
        "greedy_continuation_text": continuation,
        "perplexity_en": {"tokens": len(text_ids), "ppl": ppl},
    }
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()

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
    """The families Tokenfab runs, written from their published descriptions (not from our code):
    llama (Llama 2/3, SmolLM2, Mistral), qwen2, qwen3, gemma2, gemma3 and phi3."""

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        self.reader = reader

        def field(key, default=None):
            if key not in reader.fields:
                if default is None:
                    raise KeyError(key)
                return default
            return reader.fields[key].contents()

        arch = str(field("general.architecture"))
        self.arch = arch
        a = arch + "."
        self.n_layer = int(field(a + "block_count"))
        self.dim = int(field(a + "embedding_length"))
        self.n_head = int(field(a + "attention.head_count"))
        self.n_kv_head = int(field(a + "attention.head_count_kv"))
        self.head_dim = int(field(a + "attention.key_length", self.dim // self.n_head))
        self.rot_dim = int(field(a + "rope.dimension_count", self.head_dim))
        self.rope_base = float(field(a + "rope.freq_base", 10000.0))
        self.eps = float(field(a + "attention.layer_norm_rms_epsilon"))
        gemma = arch in ("gemma2", "gemma3")
        # RoPE pairs: Llama's GGUF rows are permuted so that adjacent dimensions pair; the other
        # families keep their checkpoints' halves pairing (GPT-NeoX style).
        self.halves = arch != "llama"
        self.gelu = gemma
        self.embed_scale = math.sqrt(self.dim) if gemma else 1.0
        # Gemma's query_pre_attn_scalar: the head size, except the 27B models' n_embd / n_head.
        big = {"gemma2": 46, "gemma3": 62}.get(arch) == self.n_layer
        self.attn_scale = 1.0 / math.sqrt(self.dim / self.n_head if big else self.head_dim)
        self.attn_softcap = float(field(a + "attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0
        self.final_softcap = float(field(a + "final_logit_softcapping", 30.0)) if arch == "gemma2" else 0.0
        # Per layer: (sliding window or 0, RoPE base, linear position scale).
        scale_type = str(field(a + "rope.scaling.type", "none"))
        pos_scale = 1.0 / float(field(a + "rope.scaling.factor", 1.0)) if scale_type == "linear" else 1.0
        window = int(field(a + "attention.sliding_window", 0)) if gemma else 0
        self.layer_spec = []
        for i in range(self.n_layer):
            if arch == "gemma2" and i % 2 == 0:
                self.layer_spec.append((window, self.rope_base, pos_scale))
            elif arch == "gemma3" and (i + 1) % 6 != 0:
                self.layer_spec.append((window, float(field(a + "rope.freq_base_swa", 10000.0)), 1.0))
            else:
                self.layer_spec.append((0, self.rope_base, pos_scale))
        self.attn_factor = float(field(a + "rope.scaling.attn_factor", 1.0)) if arch == "phi3" else 1.0
        log(f"{arch}: layers {self.n_layer}, dim {self.dim}, heads {self.n_head}/"
            f"{self.n_kv_head} kv, head_dim {self.head_dim}, rope base {self.rope_base}, "
            f"eps {self.eps}, windows {[w for w, _, _ in self.layer_spec]}")

        # Each weight dequantized once and kept as float64.
        self.w = {}
        for i, tensor in enumerate(reader.tensors):
            self.w[tensor.name] = load_tensor(tensor)
            if i % 40 == 0:
                log(f"dequantized {i + 1}/{len(reader.tensors)} tensors ({tensor.name})")
        self.embd = self.w["token_embd.weight"]  # (vocab, dim); also the tied output
        self.output = self.w.get("output.weight", self.embd)
        # Frequency factors: Llama 3's rope_freqs, Phi-3's short LongRoPE factors.
        self.freq_factors = self.w.get("rope_freqs.weight", self.w.get("rope_factors_short.weight"))
        log(f"weights ready: {len(self.w)} tensors, output "
            f"{'output.weight' if 'output.weight' in self.w else 'tied to token_embd.weight'}")

    def rms_norm(self, x, weight):
        # x: (..., n); Gemma's converter has already added 1 to its weights.
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x, positions, base, pos_scale):
        # x: (T, heads, head_dim). Pair i (of rot_dim / 2) turns by
        # pos * pos_scale * base^(-2i / rot_dim) / factor_i; the values scale by attn_factor.
        half = self.rot_dim // 2
        inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / self.rot_dim)
        if self.freq_factors is not None:
            inv_freq = inv_freq / self.freq_factors
        angle = positions[:, None].astype(np.float64) * pos_scale * inv_freq[None, :]  # (T, half)
        cos = np.cos(angle)[:, None, :] * self.attn_factor
        sin = np.sin(angle)[:, None, :] * self.attn_factor
        out = x.copy()
        if self.halves:
            a, b = x[..., :half], x[..., half:2 * half]
            out[..., :half] = a * cos - b * sin
            out[..., half:2 * half] = a * sin + b * cos
        else:
            a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
            out[..., 0:2 * half:2] = a * cos - b * sin
            out[..., 1:2 * half:2] = a * sin + b * cos
        return out

    def qkv(self, h, p):
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        if p + "attn_qkv.weight" in self.w:  # phi3: one matrix, Q rows then K then V
            fused = h @ self.w[p + "attn_qkv.weight"].T
            q, k, v = fused[:, :q_dim], fused[:, q_dim:q_dim + kv_dim], fused[:, q_dim + kv_dim:]
        else:
            q = h @ self.w[p + "attn_q.weight"].T
            k = h @ self.w[p + "attn_k.weight"].T
            v = h @ self.w[p + "attn_v.weight"].T
        if p + "attn_q.bias" in self.w:  # qwen2
            q, k, v = q + self.w[p + "attn_q.bias"], k + self.w[p + "attn_k.bias"], v + self.w[p + "attn_v.bias"]
        return q, k, v

    def attention(self, h, layer):
        # h: (T, dim) normed input. Returns (T, dim) before the residual.
        T = h.shape[0]
        p = f"blk.{layer}."
        q, k, v = self.qkv(h, p)
        q = q.reshape(T, self.n_head, self.head_dim)
        k = k.reshape(T, self.n_kv_head, self.head_dim)
        v = v.reshape(T, self.n_kv_head, self.head_dim)
        if p + "attn_q_norm.weight" in self.w:  # qwen3, gemma3: each head normed
            q = self.rms_norm(q, self.w[p + "attn_q_norm.weight"])
            k = self.rms_norm(k, self.w[p + "attn_k_norm.weight"])
        window, base, pos_scale = self.layer_spec[layer]
        positions = np.arange(T)
        q = self.rope(q, positions, base, pos_scale)
        k = self.rope(k, positions, base, pos_scale)
        group = self.n_head // self.n_kv_head
        query, key = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        hidden = key > query  # the future
        if window > 0:
            hidden |= key <= query - window  # outside the window
        out = np.empty((T, self.n_head, self.head_dim))
        for head in range(self.n_head):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T * self.attn_scale  # (T, T)
            if self.attn_softcap > 0:
                scores = self.attn_softcap * np.tanh(scores / self.attn_softcap)
            scores[hidden] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head, :] = probs @ v[:, kv, :]
        return out.reshape(T, self.n_head * self.head_dim) @ self.w[p + "attn_output.weight"].T

    def feed_forward(self, h, layer):
        p = f"blk.{layer}."
        if p + "ffn_gate.weight" in self.w:
            gate = h @ self.w[p + "ffn_gate.weight"].T  # (T, ffn)
            up = h @ self.w[p + "ffn_up.weight"].T
        else:  # phi3: ffn_up holds the gate rows, then the up rows
            fused = h @ self.w[p + "ffn_up.weight"].T
            gate, up = np.split(fused, 2, axis=-1)
        if self.gelu:  # GELU, tanh approximation
            act = 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3)))
        else:
            act = gate / (1.0 + np.exp(-gate))
        return (act * up) @ self.w[p + "ffn_down.weight"].T

    def forward(self, ids):
        """Logits (T, vocab) for token ids (T,), position i seeing tokens 0..i."""
        x = self.embd[np.asarray(ids)] * self.embed_scale  # (T, dim)
        for layer in range(self.n_layer):
            p = f"blk.{layer}."
            a = self.attention(self.rms_norm(x, self.w[p + "attn_norm.weight"]), layer)
            if p + "post_attention_norm.weight" in self.w:
                a = self.rms_norm(a, self.w[p + "post_attention_norm.weight"])
            x = x + a
            f = self.feed_forward(self.rms_norm(x, self.w[p + "ffn_norm.weight"]), layer)
            if p + "post_ffw_norm.weight" in self.w:
                f = self.rms_norm(f, self.w[p + "post_ffw_norm.weight"])
            x = x + f
        x = self.rms_norm(x, self.w["output_norm.weight"])
        logits = x @ self.output.T
        if self.final_softcap > 0:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits


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


# ---------------------------------------------------------------------------------------------
# The families on synthetic files: tokenfab-cli synth writes each `<family>-tiny` shape (random
# weights, F32 matrices, seed FAMILY_SEED); the file's SHA-256 goes into the golden so the test
# knows it computes on the same weights.

FAMILIES = ["llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]
FAMILY_SEED = 7
FAMILY_TEXT = b"The quick brown fox jumps over the lazy dog, then naps in the sun."
FAMILY_GREEDY = 12


def compact_json(value):
    """Indented JSON with each list of numbers on one line."""
    import re
    text = json.dumps(value, indent=1)
    return re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]",
                  lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text)


def short(x):
    return float(f"{float(x):.8g}")


def family_goldens(cli, out_path):
    import subprocess
    import tempfile
    # The synthetic vocabulary: ids 3..258 are the bytes 0..255.
    prompt = [3 + b for b in FAMILY_TEXT]
    golden = {"source": "tools/reference_forward.py --families (NumPy float64 reference forward "
                        "on files written by `tokenfab-cli synth --shape <family>-tiny --type f32 "
                        f"--seed {FAMILY_SEED}`)",
              "seed": FAMILY_SEED, "prompt_ids": prompt, "families": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            path = os.path.join(tmp, family + ".gguf")
            subprocess.run([cli, "synth", "--shape", family + "-tiny", "--type", "f32",
                            "--seed", str(FAMILY_SEED), "--out", path], check=True,
                           stdout=subprocess.DEVNULL)
            model = Model(path)
            logits = model.forward(prompt)
            ids, generated, greedy_margins = list(prompt), [], []
            for step in range(FAMILY_GREEDY):
                last = (logits if step == 0 else model.forward(ids))[-1]
                next_id = int(last.argmax())
                top2 = np.sort(last)[-2:]
                greedy_margins.append(float(top2[1] - top2[0]))
                generated.append(next_id)
                ids.append(next_id)
            top2 = np.sort(logits, axis=-1)[:, -2:]
            golden["families"][family] = {
                "sha256": sha256_of(path),
                "per_position_argmax": [int(i) for i in logits.argmax(axis=-1)],
                # Eight significant digits: far below the test's tolerance, and a small file.
                "last_logits": [short(v) for v in logits[-1][:64]],
                "position_logits_rms": [short(np.sqrt(np.mean(r * r))) for r in logits],
                "first_logits": [[short(v) for v in r[:8]] for r in logits],
                "greedy_continuation_ids": generated,
                # Top-1 minus top-2 logit: where it is below the test's tolerance the two tools
                # may rightly pick different tokens (random weights give near-ties).
                "per_position_margin": [short(m) for m in top2[:, 1] - top2[:, 0]],
                "greedy_margins": [short(m) for m in greedy_margins],
            }
            log(f"{family}: greedy {generated}")
    with open(out_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(compact_json(golden) + "\n")
    os.replace(out_path + ".tmp", out_path)
    log(f"wrote {out_path}")


# ---------------------------------------------------------------------------------------------
# Gemma 3 270M (Q4_K_M, SentencePiece): the prompt ids from HF tokenizers set up as SentencePiece
# BPE over the file's vocabulary (tools/golden_tokenizer_families.py), BOS first as the file asks.

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PPL_TOKENS = 256  # predictions of the perplexity window (after BOS)


def gemma_golden(path, text_path, out_path):
    sha = sha256_of(path)
    if sha != GEMMA_SHA256:
        raise SystemExit(f"{path}: sha256 {sha}, expected {GEMMA_SHA256}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import golden_tokenizer_families as gt
    model = Model(path)
    d = gt.tokenizer_dict(model.reader)
    tok = gt.sentencepiece_hf(d["tokens"], d["scores"], d["token_type"], d["unk_token_id"], False)
    bos = int(d["bos_token_id"])
    prompt = [bos] + gt.encode(tok, PROMPT, False)
    log(f"prompt {PROMPT!r} -> {prompt}")
    logits = model.forward(prompt)
    last = logits[-1]
    top20 = np.argsort(-last, kind="stable")[:20]
    top2 = np.sort(logits, axis=-1)[:, -2:]
    ids, generated, margins = list(prompt), [], []
    for step in range(N_GREEDY * 2):
        row = last if step == 0 else model.forward(ids)[-1]
        pair = np.sort(row)[-2:]
        margins.append(float(pair[1] - pair[0]))
        generated.append(int(row.argmax()))
        ids.append(generated[-1])
    continuation = tok.decode(generated)
    log(f"continuation {continuation!r}")
    with open(text_path, encoding="utf-8") as f:
        text_ids = [bos] + gt.encode(tok, f.read(), False)[:GEMMA_PPL_TOKENS]
    logp = log_softmax(model.forward(text_ids)[:-1])
    nll = -logp[np.arange(len(text_ids) - 1), text_ids[1:]]
    ppl = float(math.exp(nll.mean()))
    log(f"perplexity {ppl:.4f} over {len(text_ids) - 1} predictions")
    golden = {
        "source": "tools/reference_forward.py --gemma (NumPy float64 reference, dequantized "
                  "weights; prompt ids from HF tokenizers as SentencePiece BPE)",
        "model_sha256": sha, "prompt": PROMPT, "prompt_ids": [int(i) for i in prompt],
        "last_logits_top20": [[int(i), float(last[i])] for i in top20],
        "last_logits_first256": [float(v) for v in last[:256]],
        "per_position_argmax": [int(i) for i in logits.argmax(axis=-1)],
        "per_position_margin": [float(m) for m in top2[:, 1] - top2[:, 0]],
        "greedy_continuation_ids": generated, "greedy_margins": margins,
        "greedy_continuation_text": continuation,
        "perplexity_en": {"text_ids": [int(i) for i in text_ids], "ppl": ppl},
    }
    with open(out_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(compact_json(golden) + "\n")
    os.replace(out_path + ".tmp", out_path)
    log(f"wrote {out_path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=None)
    parser.add_argument("--text", default=os.path.join(REPO_ROOT, "tests/data/perplexity_en.txt"))
    parser.add_argument("--families", metavar="TOKENFAB_CLI",
                        help="write the synthetic families' golden (tests/data/"
                             "forward_families_golden.json) with this tokenfab-cli's synth")
    parser.add_argument("--gemma", metavar="PATH",
                        help="write Gemma 3 270M's golden (tests/data/forward_gemma3_golden.json)")
    args = parser.parse_args()
    if args.gemma:
        gemma_golden(args.gemma, args.text, args.out or os.path.join(
            REPO_ROOT, "tests/data/forward_gemma3_golden.json"))
        return
    if args.families:
        family_goldens(args.families, args.out or os.path.join(
            REPO_ROOT, "tests/data/forward_families_golden.json"))
        return
    args.out = args.out or os.path.join(REPO_ROOT, "tests/data/forward_golden.json")

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

#!/usr/bin/env python3
"""Source of tests/data/tokenizer_golden.json: golden token ids for the SmolLM2 tokenizer.

The ids come from an implementation independent of ours: the HuggingFace `tokenizers` library.
It gets the GGUF file's own vocabulary and merges (read with the `gguf` package) and the
pre-tokenizer that SmolLM2's tokenizer.json declares, which is what `tokenizer.ggml.pre = smollm`
stands for: Digits(individual_digits=True) followed by ByteLevel(add_prefix_space=False,
use_regex=True), i.e. every digit alone, then the GPT-2 pattern. Control and user-defined tokens
(token types 3 and 4) are added as special tokens, so they are matched whole in the text; entries
with "parse_special": false are encoded by the same model without them.

Rerun (needs the model, fetched by `tokenfab-cli fetch`, and `pip install gguf tokenizers`):
    python3 tools/golden_tokenizer.py [--model PATH] [--out tests/data/tokenizer_golden.json]
The model defaults to tokenfab's cache ($TOKENFAB_HOME/models, $XDG_CACHE_HOME/tokenfab/models or
~/.cache/tokenfab/models)/SmolLM2-135M-Instruct.Q4_1.gguf. The strings are written for this
project (below); tests/tokenizer/test_tokenizer.cpp checks that our encoder reproduces every id.
"""

import argparse
import json
import os
from pathlib import Path

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

# (text, parse_special)
CASES = [
    ("Hello", False),
    ("Hello, world!", False),
    ("The quick brown fox jumps over the lazy dog.", False),
    ("12345 3.14159", False),
    ("안녕하세요 세계", False),
    ("👍🏽 🚀", False),
    ("a   b\n\n\tc", False),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", False),
    ("for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }", False),
    ("I'm sure you're right, they've said it'll work; he'd know. Don't, won't, can't.", False),
    ("I'M SURE YOU'RE RIGHT, THEY'LL SEE", False),
    ("Café, naïve, façade, São Paulo, Zürich, Øresund, Ångström", False),
    ("自然语言处理是人工智能的一个分支。日本語のテキストも。", False),
    ("Wait... what?!? (yes) [no] {maybe} <tag/> --- *** ~~~ @#$%^&", False),
    ("   leading spaces", False),
    ("trailing spaces   ", False),
    (" ", False),
    ("", False),
    ("line1\nline2\r\nline3\n\n\n", False),
    ("abc123def 4th 2024-05-01 v1.2.3 x86_64", False),
    ("١٢٣ Ⅻ ½ ² ３", False),
    (CHATML, True),
    (CHATML, False),
    ("<|endoftext|><|im_start|>text<|im_end|> <|im_end|>", True),
    ("https://example.com/path?q=1&x=2 mail@example.org", False),
    ("Привет, мир! Как дела?", False),
    ("مرحبا بالعالم", False),
    ("नमस्ते दुनिया", False),
    ("👨‍👩‍👧‍👦 family, ❤️ heart, 🇰🇷 flag", False),
    ('{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}', False),
    ("\t\tindented\n  \u00a0nbsp\u3000ideographic space", False),
    ("a" * 64, False),
    ("ctrl\x04chars\x1d dropped \x13 when the vocab lacks them\x00", False),
    ("E = mc² ∑ x_i ≤ ∞ → λ", False),
    ("# Title\n\n- item **bold** _it_ `code`\n", False),
    ("Speculative decoding proposes several tokens with a small draft head; the target model "
     "verifies them in one forward pass, so accepted tokens per step multiply decode speed.", False),
]


def byte_char(b: int) -> str:
    """GPT-2's byte-to-unicode mapping: printable bytes stand for themselves, the rest U+0100.."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if b in printable:
        return chr(b)
    return chr(0x100 + sorted(set(range(256)) - set(printable)).index(b))


def default_model() -> Path:
    if os.environ.get("TOKENFAB_HOME"):
        base = Path(os.environ["TOKENFAB_HOME"]) / "models"
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]) / "tokenfab" / "models"
    else:
        base = Path.home() / ".cache" / "tokenfab" / "models"
    return base / MODEL_FILE


def field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    if len(f.types) > 1 and f.types[1].name == "STRING":  # array of strings
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    if len(f.types) > 1:  # array of numbers
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def build(reader: GGUFReader, with_specials: bool) -> Tokenizer:
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "smollm"
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    vocab = {text: i for i, text in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate vocabulary entries"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    if with_specials:
        tok.add_special_tokens([
            AddedToken(text, special=True, normalized=False)
            for text, kind in zip(tokens, types) if kind in (3, 4)
        ])
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "tokenizer_golden.json")
    args = parser.parse_args()

    reader = GGUFReader(str(args.model))
    tokenizers = {True: build(reader, True), False: build(reader, False)}
    # Bytes without a token of their own are dropped by the BPE model (there is no unk token).
    vocab = tokenizers[True].get_vocab()
    lacking = {b for b in range(256) if byte_char(b) not in vocab}
    cases = []
    for text, parse_special in CASES:
        tok = tokenizers[parse_special]
        ids = tok.encode(text, add_special_tokens=False).ids
        kept = bytes(b for b in text.encode("utf-8") if b not in lacking).decode("utf-8")
        assert tok.decode(ids, skip_special_tokens=False) == kept, f"no round trip: {text!r}"
        cases.append({"text": text, "parse_special": parse_special, "ids": ids})

    # Spot checks by hand, independent of the code above.
    assert cases[0]["ids"] == [vocab["Hello"]], "'Hello' should be one token"
    assert tokenizers[True].encode("<|im_start|>").ids == [1]
    assert cases[3]["ids"][:5] == [vocab[d] for d in "12345"], "digits should be split one by one"

    doc = {
        "source": "tools/golden_tokenizer.py (HuggingFace tokenizers over the GGUF vocab/merges)",
        "model": MODEL_FILE,
        "cases": cases,
    }
    # One case per line keeps diffs readable.
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    header = json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False)[:-1]
    text = header + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    assert json.loads(text) == doc
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()

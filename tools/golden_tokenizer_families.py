#!/usr/bin/env python3
"""Source of the tokenizer goldens for the model families beyond SmolLM2 (tests/data/):

  tokenizer_gemma3_golden.json         Gemma 3 270M's SentencePiece vocabulary (262,144 tokens,
                                       add_space_prefix false): token ids of strings written here.
  tokenizer_sentencepiece_golden.json  a small SentencePiece BPE vocabulary with byte fallback and
                                       add_space_prefix true (Llama 2 / Mistral 7B / Phi-3 style),
                                       and token ids of strings written here.
  tokenizer_pre_golden.json            pre-tokenizer splits (llama-bpe, qwen2, tekken) of strings
                                       written here.
  tokenizer_bpe_families_golden.json   a small byte-level BPE vocabulary and token ids of strings
                                       encoded through it with `pre` = qwen2 / deepseek-r1-qwen /
                                       tekken.

Where the values come from (none of it shares code with tokenfab):
  * SentencePiece vocabularies (Gemma 3 and the small one): HuggingFace `tokenizers` configured as
    SentencePiece BPE -- a BPE model with byte fallback whose merges are recovered from the token
    scores (transformers' generate_merges; only normal and user-defined tokens, SentencePiece's
    "pieces", take part), a normalizer writing spaces as "▁" (with add_space_prefix, after a
    Prepend("▁"): one more "▁" opens every text between special tokens, as Llama 2's and Phi-3's
    own tokenizer.json and llama.cpp do), control tokens added as special tokens and user-defined
    ones as plain added tokens (both matched whole in the raw text). The vocabulary, scores and
    types are the GGUF file's `tokenizer.ggml.*` metadata, read with the `gguf` package.
    parse_special false: the same tokenizer with `encode_special_tokens = True` (control tokens
    are then plain text; user-defined ones such as "\n\n" or "<table>" are still matched whole).
    Cross-checks: (1) Google's `sentencepiece` library running a BPE model built from the same
    pieces, scores and types (byte fallback, dummy prefix = add_space_prefix, no whitespace
    folding) -- the SentencePiece algorithm itself -- must agree on every string that special
    tokens do not split (with add_space_prefix, user-defined ones included) and that holds no
    literal "▁"; (2) transformers' own GGUF conversion
    (transformers.integrations.gguf.convert_gguf_tokenizer, the code behind
    AutoTokenizer.from_pretrained(dir, gguf_file=...), called directly because that entry point
    needs torch) must agree too, except on Gemma text with a run of more than 31 spaces or a
    literal "▁▁": it respells Gemma's user-defined space-run tokens ("  " .. 31 spaces) as "▁▁"..
    BPE tokens merged by vocabulary position, where SentencePiece, llama.cpp and we match the
    longest run of spaces whole in the text.
  * The small SentencePiece vocabulary itself: trained here by `sentencepiece` (BPE, byte
    fallback, one user-defined and two control symbols) on a few lines written here.
  * Pre-tokenizer splits: HF tokenizers' Split(Regex(pattern), behavior="isolated") with the
    patterns transformers uses for those `tokenizer.ggml.pre` values
    (gguf_tokenizer_mapping.GGUF_PRE_TOKENIZER_SPLITS; qwen2's is Qwen2Tokenizer's
    PRETOKENIZE_REGEX). The tekken pattern is also checked below against the one llama.cpp quotes
    from Mistral Nemo's tokenizer.json.
  * The small byte-level BPE: trained here by HF tokenizers (BpeTrainer, GPT-2 byte alphabet) on
    the same lines, plus one entry no merge builds (to show tekken's ignore_merges, which llama.cpp
    sets for tekken and not for qwen2). Ids from HF tokenizers with Split(pattern) then
    ByteLevel(use_regex=False), BPE(ignore_merges=True for tekken).

Rerun (needs `pip install -r tools/requirements-reference.txt`, and Gemma 3 270M, fetched by
`tokenfab-cli fetch gemma3-270m`):
    python3 tools/golden_tokenizer_families.py [--gemma PATH] [--out-dir tests/data]
The Gemma file defaults to tokenfab's cache ($TOKENFAB_HOME/models, $XDG_CACHE_HOME/tokenfab/models
or ~/.cache/tokenfab/models)/gemma-3-270m-q4_k_m.gguf. tests/tokenizer/test_tokenizer_families.cpp
checks that our tokenizer reproduces every id and split.
"""

import argparse
import io
import json
import os
from pathlib import Path

import sentencepiece as spm
from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as sp_model
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_PRE_TOKENIZER_SPLITS,
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)
from transformers.tokenization_utils_base import generate_merges

ROOT = Path(__file__).resolve().parent.parent
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"

# The tekken pattern as llama.cpp's llama-vocab.cpp quotes it ("original regex from
# tokenizer.json"), to check transformers' copy against.
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

GEMMA_CHAT = "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n"

# (text, parse_special) for Gemma 3.
GEMMA_CASES = [
    ("Hello world", False),
    ("Hello, world! The quick brown fox jumps over the lazy dog.", False),
    (" leading space", False),
    ("  two leading spaces and trailing ones  ", False),
    ("", False),
    ("a  b   c    d" + " " * 40 + "e", False),
    ("line1\nline2\r\nline3\n\n\nend\n" + "\n" * 40, False),
    ("\tindented\t\ttabs\t \t", False),
    ("12345 3.14159 2024-05-01 v1.2.3 1,000,000", False),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", False),
    ("for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }", False),
    ("I'm sure you're right, they've said it'll work. DON'T SHOUT.", False),
    ("Café, naïve, façade, São Paulo, Zürich, Øresund, Ångström, e\u0301", False),
    ("안녕하세요 세계. 자연어 처리", False),
    ("自然语言处理是人工智能的一个分支。日本語のテキストも。", False),
    ("Привет, мир! مرحبا بالعالم नमस्ते दुनिया", False),
    ("👍🏽 🚀 👨‍👩‍👧‍👦 🇰🇷 ❤️ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", False),
    # Characters without a token of their own: their UTF-8 bytes as <0xNN> tokens.
    ("rare: \U00020000\U0002A6D6 \U000E0041 \U0010FFFD end", False),
    ("x\x00y\x07z\x1f", False),
    ("<table><tr><td>cell</td></tr></table> <b>bold</b> [multimodal]", False),
    ("\u2581 literal lower one eighth block \u2581\u2581x", False),
    (GEMMA_CHAT, True),
    (GEMMA_CHAT, False),
    ("<bos><start_of_turn>user\nHi<end_of_turn>\n<eos><pad><mask><unused0>", True),
    ("<bos><start_of_turn>user\nHi<end_of_turn>\n<eos><pad><mask><unused0>", False),
    ("<start_of_turn><end_of_turn>", True),
    ("text<start_of_turn> spaced <end_of_turn>text", True),
    ('{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}', False),
    ("https://example.com/path?q=1&x=2 mail@example.org", False),
    ("E = mc² ∑ x_i ≤ ∞ → λ ½ Ⅻ ١٢٣", False),
    ("Speculative decoding proposes several tokens with a small draft head; the target model "
     "verifies them in one forward pass, so accepted tokens per step multiply decode speed.", False),
]

# Training text for the two small vocabularies.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into pieces; the model sees only their ids.",
    "def encode(text):",
    "    return [vocab[piece] for piece in split(text)]",
    "Hello, world! It's 2024 and we're decoding at 1,000 tokens/s.",
    "Speculative decoding proposes several tokens with a small draft head.",
    "Le café est très bon. Über die Brücke gehen wir morgen früh.",
    "CamelCaseWords and ALLCAPS and Title Case and snake_case names.",
    "path/to/file.txt and https://example.com/a/b//c",
]

# (text, parse_special) for the small SentencePiece vocabulary.
SP_CASES = [
    ("Hello world", False),
    ("The quick brown fox jumps over the lazy dog.", False),
    (" leading space", False),
    ("  two leading spaces", False),
    ("trailing spaces  ", False),
    ("", False),
    (" ", False),
    ("a  b   c", False),
    ("line1\nline2\n\n\tindented", False),
    ("12345 tokens/s", False),
    ("def encode(text):\n    return [vocab[piece] for piece in split(text)]\n", False),
    ("Über die Brücke, très bon café", False),
    ("안녕 세계 🚀 Ω≈ç√", False),  # no token: byte fallback
    ("x\x00y", False),
    ("use <tool> here<tool>twice", False),
    ("<|user|>\nHello<|end|>\n", True),
    ("<|user|>\nHello<|end|>\n", False),
    ("<|user|> spaced <|end|><|end|>x", True),
    ("<s>Hi</s>", True),
    ("<s>Hi</s>", False),
]

# Strings for the pre-tokenizer splits: cases, marks, scripts, digits, contractions, newlines.
PRE_CASES = [
    "Hello world's 12345 ABC'S",
    "CamelCaseWords HTTPServer iPhone ALLCAPS Title MiXeD aBC",
    "don't I'LL we've They'Re it'd",
    "1234567 3.14159 ١٢٣٤ ½ Ⅻ x²y",
    "a\n\n  b\r\n\r\nc  \n",
    "tab\tword  \n  \t x",
    "x!!\n\ny #hash ...\n// comment\n/path/to//file\n",
    "a/b//\n/c url: https://example.com/a/b/",
    "e\u0301t\u00e9 Cafe\u0301 A\u0301B\u0300c \u0301x",
    "\u01c5ungla \u01c8ubljana \u02b0ello \u02c6x",
    "नमस्ते दुनिया किताबें",
    "안녕하세요 세계 自然语言处理 日本語のテキスト",
    "Привет Мир ПРИВЕТ мИР",
    "مرحبا بالعالم שָׁלוֹם",
    "👍🏽 🚀 👨‍👩‍👧‍👦 🇰🇷 ❤️",
    "   leading and trailing   ",
    " ",
    "",
    "\n",
    "foo_bar-baz=qux;  (x) [y] {z} <w>",
    "ǅ ǈ ǋ ǲ ᾈ ᾉ",
    "Éclair ÉCLAIR éclair",
]

PRE_NAMES = ["llama-bpe", "qwen2", "tekken"]

# (pre, text, parse_special) through the small byte-level BPE vocabulary.
BPE_CASES = [
    (pre, text, parse_special)
    for pre in ("qwen2", "deepseek-r1-qwen", "tekken")
    for text, parse_special in [
        ("Hello, world! It's 2024 and we're decoding at 1,000 tokens/s.", False),
        ("CamelCaseWords and ALLCAPS Title Case snake_case", False),
        ("path/to/file.txt https://example.com/a/b//c\n\n", False),
        ("Le café est très bon. Über die Brücke", False),
        ("Tekken tekken TEKKEN", False),
        ("tokens<|im_end|>\nHello 12345", True),
        ("tokens<|im_end|>\nHello 12345", False),
        ("안녕 🚀", False),
    ]
]


def default_gemma() -> Path:
    if os.environ.get("TOKENFAB_HOME"):
        base = Path(os.environ["TOKENFAB_HOME"]) / "models"
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]) / "tokenfab" / "models"
    else:
        base = Path.home() / ".cache" / "tokenfab" / "models"
    return base / GEMMA_FILE


def field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    if len(f.types) > 1 and f.types[1].name == "STRING":  # array of strings
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    if len(f.types) > 1:  # array of numbers
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def tokenizer_dict(reader: GGUFReader) -> dict:
    """What transformers' get_gguf_tokenizer makes of the file (that function needs torch)."""
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    return {name: field(reader, f"tokenizer.{key}") for key, name in renames.items()
            if f"tokenizer.{key}" in reader.fields}


def encode(tok: Tokenizer, text: str, parse_special: bool) -> list:
    tok.encode_special_tokens = not parse_special
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False


def sentencepiece_hf(tokens, scores, types, unk: int, add_space_prefix: bool) -> Tokenizer:
    """HF tokenizers set up as SentencePiece BPE over a GGUF-style vocabulary (see the docstring)."""
    vocab = {text: i for i, text in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate vocabulary entries"
    not_pieces = [text for text, kind in zip(tokens, types) if kind not in (1, 4)]
    merges = generate_merges(vocab, dict(zip(tokens, scores)), skip_tokens=not_pieces)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk], fuse_unk=True,
                               byte_fallback=True))
    escape = normalizers.Replace(" ", "\u2581")
    tok.normalizer = (normalizers.Sequence([normalizers.Prepend("\u2581"), escape])
                      if add_space_prefix else escape)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False)
                            for text, kind in zip(tokens, types) if kind == 3])
    tok.add_tokens([AddedToken(text, special=False, normalized=False)
                    for text, kind in zip(tokens, types) if kind == 4])
    return tok


def sentencepiece_model(tokens, scores, types, unk: int, add_dummy_prefix: bool):
    """A SentencePiece BPE model over a vocabulary: SentencePiece's own encoder, as a cross-check."""
    proto = sp_model.ModelProto()
    proto.trainer_spec.model_type = sp_model.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.unk_id = unk
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = add_dummy_prefix
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for i, (text, score, kind) in enumerate(zip(tokens, scores, types)):
        piece = proto.pieces.add()
        # Gemma's file stores its user-defined runs of spaces as spaces; SentencePiece matches
        # user-defined pieces in the text after spaces became "▁".
        piece.piece = text.replace(" ", "\u2581") if kind == 4 else text
        piece.score = score
        piece.type = 2 if i == unk else kind
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


def has_token_text(text: str, tokens, types, token_type: int) -> bool:
    return any(kind == token_type and tok in text for tok, kind in zip(tokens, types))


def dump(path: Path, header: dict, sections: dict) -> None:
    """JSON with one case (or vocab array) per line, so diffs stay readable."""
    parts = [json.dumps(header, ensure_ascii=False)[:-1]]
    for key, value in sections.items():
        if isinstance(value, list):
            body = ",\n  ".join(json.dumps(v, ensure_ascii=False) for v in value)
            parts.append(f'"{key}": [\n  {body}\n ]')
        else:
            parts.append(f'"{key}": {json.dumps(value, ensure_ascii=False)}')
    text = parts[0] + ",\n " + ",\n ".join(parts[1:]) + "\n}\n"
    assert json.loads(text) == {**header, **sections}
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


def sentencepiece_cases(case_list, tokens, scores, types, unk: int, add_space_prefix: bool,
                        transformers_tok: Tokenizer, transformers_may_differ) -> list:
    """Golden ids of `case_list` from sentencepiece_hf, checked against the two other oracles."""
    tok = sentencepiece_hf(tokens, scores, types, unk, add_space_prefix)
    sp = sentencepiece_model(tokens, scores, types, unk, add_space_prefix)
    cases = []
    for text, parse_special in case_list:
        ids = encode(tok, text, parse_special)
        # sentencepiece knows no special tokens in the text, and puts no "▁" after a user-defined
        # one; its model spells user-defined space runs "▁▁..", which a literal "▁" would match.
        split_by_specials = (parse_special and has_token_text(text, tokens, types, 3)) or (
            add_space_prefix and has_token_text(text, tokens, types, 4))
        if not split_by_specials and "\u2581" not in text:
            assert sp.encode(text) == ids, f"sentencepiece disagrees on {text!r}"
        assert (encode(transformers_tok, text, parse_special) == ids) != transformers_may_differ(
            text), f"transformers' GGUF conversion unexpectedly (dis)agrees on {text!r}"
        if "\u2581" not in text:  # a literal "▁" decodes to a space
            assert tok.decode(ids, skip_special_tokens=False) == text or add_space_prefix, text
        cases.append({"text": text, "parse_special": parse_special, "ids": ids})
    assert any(types[i] == 6 for c in cases for i in c["ids"]), "no case exercises byte fallback"
    return cases


def gemma_goldens(path: Path, out: Path) -> None:
    reader = GGUFReader(str(path))
    d = tokenizer_dict(reader)
    assert d["tokenizer_type"] == "llama" and d["add_prefix_space"] is False
    transformers_tok, _ = convert_gguf_tokenizer(field(reader, "general.architecture"), d)
    tokens, types = d["tokens"], d["token_type"]
    cases = sentencepiece_cases(GEMMA_CASES, tokens, d["scores"], types, d["unk_token_id"], False,
                                transformers_tok, lambda text: " " * 32 in text or "\u2581" * 2 in text)
    # Spot checks by hand, independent of the code above.
    vocab = {t: i for i, t in enumerate(tokens)}
    assert cases[0]["ids"] == [vocab["Hello"], vocab["\u2581world"]]
    assert cases[5]["ids"][-3:] == [vocab[" " * 31], vocab[" " * 9], vocab["e"]]
    dump(out / "tokenizer_gemma3_golden.json",
         {"source": "tools/golden_tokenizer_families.py (HF tokenizers as SentencePiece BPE over "
                    "the GGUF vocabulary, cross-checked with sentencepiece and transformers)",
          "model": GEMMA_FILE},
         {"cases": cases})


def train_sentencepiece():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, model_type="bpe", vocab_size=420,
        byte_fallback=True, character_coverage=1.0, num_threads=1, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", split_digits=True,
        user_defined_symbols=["<tool>"], control_symbols=["<|user|>", "<|end|>"],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    proto = sp_model.ModelProto()
    proto.ParseFromString(model.getvalue())
    return ([p.piece for p in proto.pieces], [p.score for p in proto.pieces],
            [int(p.type) for p in proto.pieces])


def sentencepiece_goldens(out: Path) -> None:
    tokens, scores, types = train_sentencepiece()
    vocab = {"tokens": tokens, "scores": scores, "token_types": types, "bos": 1, "eos": 2,
             "unk": 0, "add_space_prefix": True}
    d = {"tokenizer_type": "llama", "tokens": tokens, "scores": scores, "token_type": types,
         "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0, "add_prefix_space": True}
    transformers_tok, _ = convert_gguf_tokenizer("phi3", d)
    cases = sentencepiece_cases(SP_CASES, tokens, scores, types, 0, True, transformers_tok,
                                lambda text: False)
    dump(out / "tokenizer_sentencepiece_golden.json",
         {"source": "tools/golden_tokenizer_families.py (vocabulary trained by sentencepiece; ids "
                    "from HF tokenizers as SentencePiece BPE, cross-checked with sentencepiece and "
                    "transformers)"},
         {"vocab": vocab, "cases": cases})


def pre_goldens(out: Path) -> dict:
    patterns = {name: GGUF_PRE_TOKENIZER_SPLITS[name] for name in PRE_NAMES}
    assert patterns["tekken"] == TEKKEN_PATTERN, "transformers' tekken pattern is not llama.cpp's"
    assert GGUF_PRE_TOKENIZER_SPLITS["deepseek-r1-qwen"] == patterns["qwen2"]
    cases = []
    for name, pattern in patterns.items():
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        for text in PRE_CASES:
            pieces = [piece for piece, _ in split.pre_tokenize_str(text)]
            assert "".join(pieces) == text
            cases.append({"pre": name, "text": text, "pieces": pieces})
    dump(out / "tokenizer_pre_golden.json",
         {"source": "tools/golden_tokenizer_families.py (HF tokenizers Split(Regex(pattern), "
                    "behavior=isolated))"},
         {"patterns": patterns, "cases": cases})
    return patterns


def bpe_goldens(out: Path, patterns: dict) -> None:
    trainee = Tokenizer(models.BPE())
    trainee.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainee.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_end|>"], show_progress=False))
    model = json.loads(trainee.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    assert [model["vocab"][t] for t in tokens] == list(range(len(tokens)))
    tokens.append("Tekken")  # a whole word no merge builds: only ignore_merges finds it
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if t == "<|im_end|>" else 1 for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    cases = []
    for pre, text, parse_special in BPE_CASES:
        split = patterns["qwen2" if pre == "deepseek-r1-qwen" else pre]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                                   ignore_merges=pre == "tekken"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
        ids = encode(tok, text, parse_special)
        assert tok.decode(ids, skip_special_tokens=False) == text
        cases.append({"pre": pre, "text": text, "parse_special": parse_special, "ids": ids})
    tekken = [c["ids"] for c in cases if c["pre"] == "tekken" and c["text"].startswith("Tekken")]
    assert vocab["Tekken"] in tekken[0], "ignore_merges should find the whole word"
    dump(out / "tokenizer_bpe_families_golden.json",
         {"source": "tools/golden_tokenizer_families.py (vocabulary trained by HF tokenizers; ids "
                    "from HF tokenizers with the pre-tokenizer patterns)"},
         {"vocab": {"tokens": tokens, "merges": merges, "token_types": types}, "cases": cases})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemma", type=Path, default=default_gemma())
    parser.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "data")
    args = parser.parse_args()
    gemma_goldens(args.gemma, args.out_dir)
    sentencepiece_goldens(args.out_dir)
    bpe_goldens(args.out_dir, pre_goldens(args.out_dir))


if __name__ == "__main__":
    main()

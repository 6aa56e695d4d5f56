#!/usr/bin/env bash
# Correctness evidence for the GGUF tensor types people download: a model re-quantized by
# llama.cpp's `llama-quantize` to the common types, then, for each file (and the original), the
# same measurements from llama.cpp and from Tokenfab on the same file:
#   - perplexity of tests/data/eval_en.txt by llama.cpp's convention: `llama-perplexity -f TEXT
#     -c CTX -t N` against `tokenfab-cli perplexity --convention llama.cpp --ctx CTX --threads N`;
#   - greedy continuations of a few fixed prompts: `llama-completion -p PROMPT -n 32 --temp 0
#     -no-cnv` (raw prompt, no chat template; the token ids it read and made are taken from the
#     session file that --prompt-cache-all writes) against `tokenfab-cli generate --prompt PROMPT
#     --temperature 0 --max-tokens 32 --json` (its "ids"). Both tokenize the raw prompt with BOS
#     exactly when the model's tokenizer.ggml.add_bos_token says so; the JSON states whether the
#     prompt ids were the same, then compares the generated ids (an end-of-generation token that
#     llama.cpp keeps and Tokenfab drops is not counted);
#   - the per-tensor type mix llama-quantize chose, read with the `gguf` Python package (a venv
#     in build-llamacpp/venv, pinned as tools/requirements-reference.txt pins it), written in full
#     to QUANT_DIR/<file>.tensor_types.json and summarized in the JSON (a later
#     `tokenfab-cli quantize` must reproduce the same mix).
# A file Tokenfab cannot load gets its error message instead of its numbers; the script goes on.
#
# tests/data/eval_en.txt: original English prose written for Tokenfab's evaluations by the
# project's authors (no quotations; narrative, explanation, dialogue, a recipe, numbers), 4,608
# tokens with SmolLM2's tokenizer: 9 chunks for llama-perplexity at -c 512.
#
# llama.cpp is built by tools/llamacpp_build.sh (the copy llama-cpp-python vendors; not part of
# this repository) into build-llamacpp/; re-quantized files go to build-llamacpp/quants/ and are
# reused on later runs. Prints ONE JSON object on stdout; progress and the tools' logs go to
# stderr.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TOKENFAB_BUILD_DIR:-$root/build}"
# shellcheck source=tools/llamacpp_build.sh
source "$root/tools/llamacpp_build.sh"
quant_dir="$llamacpp_work_dir/quants"
venv="$llamacpp_work_dir/venv"
text="$root/tests/data/eval_en.txt"
default_types=(Q4_K_M Q5_K_M Q6_K Q3_K_M IQ4_XS Q2_K)
prompts=(
  "The capital of France is"
  "Once upon a time, in a small village by the sea,"
  "To make a good cup of tea, you should"
  "The three primary colors are"
)

usage() {
  cat <<EOF
Usage: tools/check_quant_files.sh [--model PATH] [--file PATH]… [--threads N] [--ctx N]
                                  [--gen-tokens N] [TYPE…]

Re-quantizes a GGUF model with llama-quantize (--allow-requantize) to ${default_types[*]}
and any extra TYPEs (llama-quantize's names), into ${quant_dir}, then compares llama.cpp
and Tokenfab on each of those files and the original: perplexity of tests/data/eval_en.txt by
llama.cpp's convention, greedy continuations of ${#prompts[@]} fixed prompts, and the per-tensor
type mix. Prints one JSON object; progress goes to stderr.

Options:
  --model PATH      GGUF model to re-quantize (default: the embedded model; \`tokenfab-cli
                    fetch\` prints its path)
  --file PATH       also compare this GGUF file as it is (e.g. one \`tokenfab-cli quantize\`
                    wrote); repeatable
  --threads N       threads for every tool (default: $(nproc))
  --ctx N           perplexity window, llama-perplexity's -c (default 512)
  --gen-tokens N    tokens generated per prompt (default 32)
  --no-requantize   compare the model and the --file files as they are (no llama-quantize): for
                    the other families (a Gemma 3 file, synthetic files of each family)
  -h, --help        this help
EOF
}

log() { echo "check_quant_files: $*" >&2; }
die() {
  echo "check_quant_files: error: $*" >&2
  exit 1
}

model=""
files=()
threads="$(nproc)"
ctx=512
gen_tokens=32
types=("${default_types[@]}")
no_requantize=0
while (($#)); do
  case "$1" in
    --model | --file | --threads | --ctx | --gen-tokens)
      (($# >= 2)) || die "$1 needs a value"
      case "$1" in
        --model) model="$2" ;;
        --file) files+=("$2") ;;
        --threads) threads="$2" ;;
        --ctx) ctx="$2" ;;
        --gen-tokens) gen_tokens="$2" ;;
      esac
      shift 2
      ;;
    --no-requantize)
      types=()
      no_requantize=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*) die "unknown option \"$1\" (see --help)" ;;
    *)
      types+=("$1")
      shift
      ;;
  esac
done
for n in "$threads" "$ctx" "$gen_tokens"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "\"$n\": expected a positive integer"
done

cli="$build_dir/bin/tokenfab-cli"
[[ -x "$cli" ]] || die "$cli not found: build Tokenfab first (tools/bootstrap.sh)"
[[ -f "$text" ]] || die "$text not found"
if [[ -z "$model" ]]; then
  log "finding the embedded model (tokenfab-cli fetch; downloads it when absent)"
  model="$("$cli" fetch)" || die "tokenfab-cli fetch failed; pass --model PATH"
fi
[[ -f "$model" ]] || die "model file $model not found"
for f in "${files[@]}"; do [[ -f "$f" ]] || die "--file $f: no such file"; done

# --- tools: llama.cpp, and the gguf package --------------------------------------------------------

llamacpp_build llama-quantize llama-perplexity llama-completion
if ! "$venv/bin/python" -c 'import importlib.metadata as m; assert m.version("gguf") == "0.19.0"' \
  2>/dev/null; then
  log "installing the gguf package into $venv"
  mapfile -t pins < <(grep -E '^(gguf|numpy)==' "$root/tools/requirements-reference.txt")
  python3 -m venv "$venv" || die "python3 -m venv failed (apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet "${pins[@]}" >&2 || die "pip install ${pins[*]} failed"
fi

# --- the files: re-quantized once ------------------------------------------------------------------

mkdir -p "$quant_dir"
stem="$(basename "$model" .gguf)"
names=(original)
paths=("$model")
for type in "${types[@]}"; do
  out="$quant_dir/$stem.$type.gguf"
  if [[ ! -f "$out" || "$model" -nt "$out" ]]; then
    log "llama-quantize $type → $out"
    "$llamacpp_bin/llama-quantize" --allow-requantize "$model" "$out.part" "$type" "$threads" \
      >"$quant_dir/$stem.$type.log" 2>&1 ||
      die "llama-quantize $type failed (see $quant_dir/$stem.$type.log)"
    mv "$out.part" "$out"
  fi
  names+=("$type")
  paths+=("$out")
done
for f in "${files[@]}"; do
  names+=("file")
  paths+=("$f")
done

# --- the measurements: raw outputs under $tmp/<file index>/ ---------------------------------------

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for i in "${!paths[@]}"; do
  f="${paths[$i]}"
  d="$tmp/$i"
  mkdir -p "$d"
  log "[${names[$i]}] llama-perplexity"
  "$llamacpp_bin/llama-perplexity" -m "$f" -f "$text" -c "$ctx" -t "$threads" \
    >"$d/llama_ppl.out" 2>"$d/llama_ppl.err" || true
  log "[${names[$i]}] tokenfab-cli perplexity --convention llama.cpp"
  "$cli" perplexity --model "$f" --file "$text" --ctx "$ctx" --threads "$threads" \
    --convention llama.cpp --json >"$d/tf_ppl.json" 2>"$d/tf_ppl.err" || true
  for j in "${!prompts[@]}"; do
    p="${prompts[$j]}"
    log "[${names[$i]}] greedy: \"$p\""
    # -c 256: the prompts are short; a small context also keeps the session file small.
    "$llamacpp_bin/llama-completion" -m "$f" -p "$p" -n "$gen_tokens" --temp 0 -no-cnv \
      -c 256 -s 0 -t "$threads" --no-display-prompt --no-warmup \
      --prompt-cache "$d/p$j.session" --prompt-cache-all \
      >"$d/p$j.llama.out" 2>"$d/p$j.llama.err" </dev/null || true
    "$cli" tokenize --model "$f" --text "$p" --no-special --json \
      >"$d/p$j.tf_prompt.json" 2>"$d/p$j.tf_prompt.err" || true
    "$cli" generate --model "$f" --prompt "$p" --temperature 0 --max-tokens "$gen_tokens" \
      --threads "$threads" --json >"$d/p$j.tf.json" 2>"$d/p$j.tf.err" || true
  done
done

# --- one JSON object ------------------------------------------------------------------------------

PYTHONPATH="$root/tools" "$venv/bin/python" - "$tmp" "$quant_dir" "$text" "$ctx" "$threads" "$gen_tokens" \
  "$llamacpp_python_version" "$llamacpp_commit" \
  "$(printf '%s\n' "${names[@]}")" "$(printf '%s\n' "${paths[@]}")" \
  "$(printf '%s\n' "${prompts[@]}")" <<'PY'
import collections, hashlib, json, os, re, struct, sys
import gguf
import numpy as np
import reference_forward  # tools/reference_forward.py: the float64 forward pass of the file

# Where the two tools' greedy tokens part, the file's exact model (float64, the file's own
# weights) says how near the two choices were: within NEAR_TIE logits, the two tools' different
# roundings (llama.cpp's and Tokenfab's 8-bit activation blocks) can pick either.
NEAR_TIE = 0.5

(tmp, quant_dir, text, ctx, threads, gen_tokens, version, commit, names, paths,
 prompts) = sys.argv[1:]
names, paths, prompts = names.splitlines(), paths.splitlines(), prompts.splitlines()

def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""

def error_of(err_path, fallback):
    """The last non-empty line a tool wrote to stderr: its error message."""
    lines = [l.strip() for l in read(err_path).splitlines() if l.strip()]
    return lines[-1] if lines else fallback

def load_json(path):
    try:
        return json.loads(read(path))
    except ValueError:
        return None

def ranges(numbers):
    """[0, 1, 2, 5] → "0-2,5"."""
    out, start = [], None
    for k, n in enumerate(numbers):
        if start is None:
            start = n
        if k + 1 == len(numbers) or numbers[k + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ",".join(out)

def tensor_mix(path, out_path):
    """Writes every tensor's type and shape to out_path; returns a summary: counts per type, and
    per name pattern (blk.N. → blk.*.) the type of each tensor, with its layers when they vary."""
    reader = gguf.GGUFReader(path)
    tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(n) for n in t.shape]}
               for t in reader.tensors}
    ftype = reader.fields.get("general.file_type")
    ftype = gguf.LlamaFileType(int(ftype.contents())).name if ftype else None
    with open(out_path, "w") as f:
        json.dump({"file": path, "ftype": ftype, "tensors": tensors}, f, indent=1)
    counts = collections.Counter(t["type"] for t in tensors.values())
    patterns = collections.defaultdict(lambda: collections.defaultdict(list))
    for name, t in tensors.items():
        m = re.match(r"blk\.(\d+)\.(.*)", name)
        key, layer = (f"blk.*.{m.group(2)}", int(m.group(1))) if m else (name, None)
        patterns[key][t["type"]].append(layer)
    summary = {}
    for key, by_type in sorted(patterns.items()):
        if len(by_type) == 1:
            summary[key] = next(iter(by_type))
        else:
            summary[key] = {ty: "layers " + ranges(sorted(layers)) for ty, layers in
                            sorted(by_type.items(), key=lambda kv: min(kv[1]))}
    eog = set()
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        if key in reader.fields:
            eog.add(int(reader.fields[key].contents()))
    return ftype, dict(sorted(counts.items())), summary, eog

def session_tokens(path):
    """Token ids from a llama.cpp session file ('ggsn', version, count, int32 ids…)."""
    try:
        with open(path, "rb") as f:
            magic, _, n = struct.unpack("<III", f.read(12))
            if magic != 0x6767736E:
                return None
            return list(struct.unpack(f"<{n}i", f.read(4 * n)))
    except (OSError, struct.error):
        return None

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()

files = []
g_prompt_ids = {}  # greedy entry → its prompt's ids
for i, (name, path) in enumerate(zip(names, paths)):
    d = os.path.join(tmp, str(i))
    base = os.path.basename(path)
    mix_path = os.path.join(quant_dir, base[:-5] if base.endswith(".gguf") else base) \
        + ".tensor_types.json"
    ftype, counts, summary, eog = tensor_mix(path, mix_path)
    entry = {"type": name, "path": path, "bytes": os.path.getsize(path), "sha256": sha256(path),
             "ftype": ftype}

    # Perplexity: llama-perplexity's "Final estimate: PPL = X +/- Y" against Tokenfab's JSON.
    log = read(os.path.join(d, "llama_ppl.err")) + read(os.path.join(d, "llama_ppl.out"))
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    if final:
        llama = {"ppl": float(final.group(1)), "ppl_stderr": float(final.group(2)),
                 "chunks": int(chunks.group(1)) if chunks else None}
    else:
        llama = {"error": error_of(os.path.join(d, "llama_ppl.err"), "no final estimate")}
    tf = load_json(os.path.join(d, "tf_ppl.json"))
    if tf and "ppl" in tf:
        tf = {k: tf[k] for k in ("ppl", "ppl_stderr", "chunks", "tokens", "text_tokens")}
    else:
        tf = {"error": error_of(os.path.join(d, "tf_ppl.err"), "no JSON")}
    ppl = {"llama_cpp": llama, "tokenfab": tf}
    if "ppl" in llama and "ppl" in tf:
        ppl["rel_diff"] = round((tf["ppl"] - llama["ppl"]) / llama["ppl"], 6)
        ppl["within_1pct"] = abs(ppl["rel_diff"]) <= 0.01
    entry["perplexity"] = ppl

    # Greedy continuations: ids from llama.cpp's session file (prompt + generated) and from
    # Tokenfab's generate JSON.
    greedy = []
    for j, prompt in enumerate(prompts):
        g = {"prompt": prompt}
        ids = session_tokens(os.path.join(d, f"p{j}.session"))
        tf_prompt = load_json(os.path.join(d, f"p{j}.tf_prompt.json"))
        tf_gen = load_json(os.path.join(d, f"p{j}.tf.json"))
        if ids is None:
            g["error"] = "llama.cpp: " + error_of(os.path.join(d, f"p{j}.llama.err"),
                                                  "no session file")
        elif not tf_prompt or not tf_gen:
            g["error"] = "tokenfab: " + error_of(
                os.path.join(d, f"p{j}.tf.err" if tf_prompt else f"p{j}.tf_prompt.err"),
                "no JSON")
        else:
            n_prompt = len(tf_prompt["ids"])
            llama_ids, tf_ids = ids[n_prompt:], tf_gen["ids"]
            if llama_ids and llama_ids[-1] in eog:
                llama_ids = llama_ids[:-1]
            g["prompt_ids_equal"] = ids[:n_prompt] == tf_prompt["ids"]
            g_prompt_ids[id(g)] = tf_prompt["ids"]
            g["agree"] = g["prompt_ids_equal"] and llama_ids == tf_ids
            if not g["agree"]:
                diff = next((k for k, (a, b) in enumerate(zip(llama_ids, tf_ids)) if a != b),
                            min(len(llama_ids), len(tf_ids)))
                g["first_difference"] = diff
                g["llama_cpp_ids"] = llama_ids
                g["tokenfab_ids"] = tf_ids
            g["tokens"] = len(tf_ids)
            g["text"] = tf_gen["text"]
        greedy.append(g)
    parted = [g for g in greedy if "first_difference" in g]
    if parted:
        model = reference_forward.Model(path)
        for g in parted:
            k = g["first_difference"]
            if k >= min(len(g["llama_cpp_ids"]), len(g["tokenfab_ids"])):
                continue  # one run ended early; no token to compare
            prefix = g_prompt_ids[id(g)] + g["tokenfab_ids"][:k]
            logits = model.forward(prefix)[-1]
            a, b = g["llama_cpp_ids"][k], g["tokenfab_ids"][k]
            best = int(np.argmax(logits))
            g["exact"] = {"llama_cpp_logit": float(logits[a]), "tokenfab_logit": float(logits[b]),
                          "best": best, "best_logit": float(logits[best]),
                          "margin": abs(float(logits[a] - logits[b])),
                          "prefers": "llama.cpp" if logits[a] > logits[b] else "tokenfab"}
            g["near_tie"] = g["exact"]["margin"] <= NEAR_TIE
        del model
    entry["greedy"] = greedy
    entry["greedy_agree"] = sum(1 for g in greedy if g.get("agree"))
    entry["greedy_agree_to_a_near_tie"] = sum(
        1 for g in greedy if g.get("agree") or g.get("near_tie"))
    entry["tensor_types"] = {"counts": counts, "by_name": summary, "json": mix_path}
    files.append(entry)

print(json.dumps({
    "model": paths[0],
    "text": text,
    "ctx": int(ctx),
    "threads": int(threads),
    "gen_tokens": int(gen_tokens),
    "llama_cpp": {"llama_cpp_python": version, "commit": commit or None},
    "files": files,
}))
PY

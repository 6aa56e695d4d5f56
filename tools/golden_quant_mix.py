#!/usr/bin/env python3
"""Source of tests/data/quant_mix_golden.json: the type llama.cpp's `llama-quantize` gives every
tensor of two models in each quantization mixture Tokenfab writes (core/model/quant_mix.h), so
that test_quant_mix can check our rules against llama.cpp's own choices.

The models:
  - the embedded SmolLM2-135M-Instruct (Q4_1; `tokenfab-cli fetch` prints its path): 576-wide
    rows, which 256 does not divide, so most matrices take the super-block types' fallbacks, and
    a tied LM head;
  - a synthetic `llama-mini` (`tokenfab-cli synth --shape llama-mini --type q8_0`): every row a
    multiple of 256, 16 layers, 4 query heads per KV head and its own output.weight, so that the
    rules apply without fallbacks.
Each is re-quantized with `llama-quantize --allow-requantize IN OUT TYPE THREADS` (llama.cpp as
llama-cpp-python 0.3.36 vendors it, built by tools/llamacpp_build.sh into build-llamacpp/) and
the output's tensor types are read with the `gguf` package (0.19.0, pinned in
tools/requirements-reference.txt; installed in the venv build-llamacpp/venv, which this script
creates when needed and re-runs itself in). Tensor types depend on names and shapes only, never
on the weights, so the file is the same on every machine.

Run from the repository with tokenfab-cli built:
    python3 tools/golden_quant_mix.py [--out tests/data/quant_mix_golden.json]
Progress and llama-quantize's logs go to stderr.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build-llamacpp"
VENV = WORK / "venv"
GGUF_VERSION = "0.19.0"
# Richest first, as quant_mix_names() lists them (llama-quantize's names).
TARGETS = ["F16", "BF16", "Q8_0", "Q6_K", "Q5_1", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_1", "Q4_K_M",
           "IQ4_NL", "Q4_K_S", "Q4_0", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K"]
THREADS = 2


def log(message):
    print("golden_quant_mix: " + message, file=sys.stderr, flush=True)


def in_venv():
    """Re-runs this script in build-llamacpp/venv (made with the pinned gguf) unless it is there."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    ok = python.exists() and subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         f"assert m.version('gguf') == '{GGUF_VERSION}'"], capture_output=True).returncode == 0
    if not ok:
        pins = [line.strip() for line in (ROOT / "tools/requirements-reference.txt").read_text()
                .splitlines() if line.startswith(("gguf==", "numpy=="))]
        log(f"installing {' '.join(pins)} into {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True,
                       stdout=sys.stderr)
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


def llama_quantize():
    """Builds llama-quantize when needed; returns its path and a description of its llama.cpp."""
    script = ('source "$1/tools/llamacpp_build.sh"; llamacpp_build llama-quantize >/dev/null; '
              'echo "$llamacpp_bin"; echo "$llamacpp_python_version"; echo "$llamacpp_commit"')
    out = subprocess.run(["bash", "-c", script, "bash", str(ROOT)], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    binary, release, commit = out[0], out[1], out[2] if len(out) > 2 else ""
    return Path(binary) / "llama-quantize", release, commit


def cli(*args):
    return subprocess.run([str(ROOT / "build/bin/tokenfab-cli"), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def describe(path, label):
    """The model as the mixture reads it: hyperparameters and tensors (in file order)."""
    import gguf
    reader = gguf.GGUFReader(path)

    def field(key):
        return int(reader.fields[key].contents())

    return {
        "model": label,
        "architecture": reader.fields["general.architecture"].contents(),
        "n_layer": field("llama.block_count"),
        "n_head": field("llama.attention.head_count"),
        "n_kv_head": field("llama.attention.head_count_kv"),
        "tensors": [{"name": t.name, "shape": [int(d) for d in t.shape],
                     "type": t.tensor_type.name} for t in reader.tensors],
    }


def types_after(binary, source, target, work):
    import gguf
    out = Path(work) / f"{Path(source).stem}.{target}.gguf"
    log(f"llama-quantize {Path(source).name} {target}")
    with open(Path(work) / "llama-quantize.log", "a") as logfile:
        subprocess.run([str(binary), "--allow-requantize", str(source), str(out), target,
                        str(THREADS)], check=True, stdout=logfile, stderr=logfile)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    out.unlink()
    return types


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests/data/quant_mix_golden.json"))
    args = parser.parse_args()
    in_venv()
    binary, release, commit = llama_quantize()
    with tempfile.TemporaryDirectory(prefix="golden-quant-mix-") as work:
        mini = Path(work) / "llama-mini.q8_0.gguf"
        cli("synth", "--shape", "llama-mini", "--type", "q8_0", "--seed", "1", "--out", str(mini))
        sources = [(Path(cli("fetch")), "SmolLM2-135M-Instruct.Q4_1 (the embedded model)"),
                   (mini, "synthetic llama-mini (tokenfab-cli synth --shape llama-mini "
                          "--type q8_0)")]
        models = []
        for path, label in sources:
            model = describe(path, label)
            model["mixes"] = {}
            for target in TARGETS:
                types = types_after(binary, path, target, work)
                model["mixes"][target] = [types[t["name"]] for t in model["tensors"]]
            models.append(model)
    golden = {
        "source": (f"llama-quantize of the llama.cpp that llama-cpp-python {release} vendors"
                   f"{' (commit ' + commit + ')' if commit else ''}, built by "
                   f"tools/llamacpp_build.sh and run as `llama-quantize --allow-requantize IN OUT "
                   f"TYPE {THREADS}` on each model for each target; the output's tensor types read "
                   f"with the gguf package {GGUF_VERSION}; written by tools/golden_quant_mix.py"),
        "targets": TARGETS,
        "models": models,
    }
    with open(args.out, "w") as f:
        # One line per tensor list or mix keeps the file readable and its diffs small.
        f.write("{\n")
        f.write(f'  "source": {json.dumps(golden["source"])},\n')
        f.write(f'  "targets": {json.dumps(TARGETS)},\n')
        f.write('  "models": [\n')
        for i, m in enumerate(models):
            f.write("    {\n")
            for key in ("model", "architecture", "n_layer", "n_head", "n_kv_head"):
                f.write(f'      "{key}": {json.dumps(m[key])},\n')
            f.write('      "tensors": [\n')
            f.write(",\n".join(f"        {json.dumps(t)}" for t in m["tensors"]))
            f.write("\n      ],\n")
            f.write('      "mixes": {\n')
            f.write(",\n".join(f"        {json.dumps(k)}: {json.dumps(v)}"
                               for k, v in m["mixes"].items()))
            f.write("\n      }\n")
            f.write("    }" + ("," if i + 1 < len(models) else "") + "\n")
        f.write("  ]\n}\n")
    json.load(open(args.out))  # the file parses
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()

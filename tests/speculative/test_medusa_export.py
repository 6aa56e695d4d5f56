#!/usr/bin/env python3
"""`tokenfab-cli heads export --format medusa-hf`, read back as vLLM would read it.

A medusa head with random weights for the embedded model (tokenfab-medusa-probe make-head: random,
so that a transposed or misnamed tensor changes the drafts) is exported; the pinned `safetensors`
package loads model.safetensors (safetensors.numpy.load_file, the same parser vLLM's loader uses),
and the test checks what vLLM's Medusa module (vllm/model_executor/models/medusa.py) and
MedusaConfig (vllm/transformers_utils/configs/medusa.py) need: exactly the tensor names
blocks.{k}.layers.0.weight / .bias and lm_heads.0.weight (renamed lm_head.weight by load_weights
with original_lm_head), their shapes (nn.Linear's out x in) and dtypes, and config.json's fields.
Then a NumPy forward of the exported tensors, z_k = h + SiLU(W_k h + b_k), argmax(LM z_k), over the
engine's own final-norm hidden states must give the engine's own drafts (tokenfab-medusa-probe
drafts: Device::medusa_top) for a few prompts. Also: an mtp head is refused with one clear message
and nothing written, an earlier export is replaced only with --force, a folder holding other files
is refused, and the default format still writes the GGUF file.

Tolerance: the engine's LM head multiplies the model's Q8_0 rows by z quantized to 8 bits per block
of 32 (its matmul kernels), while NumPy multiplies the F16 copy of the dequantized rows by z in
f32. Where two logits nearly tie the two may pick different tokens, so a draft that differs is
accepted when the engine's token's NumPy logit is within MARGIN of NumPy's largest and the engine
itself saw a lead below MARGIN (a real near-tie, not a layout error); at least MIN_EXACT of the
drafts must be equal. A wrong layout misses nearly every draft by several logits.

The packages are pinned below and installed into a virtual environment (--venv) on the first run;
that needs PyPI. Usage: test_medusa_export.py --cli build/bin/tokenfab-cli
    --probe build/bin/tokenfab-medusa-probe --venv build/export-venv
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from script_support import check, ensure_venv, fail, model_path  # noqa: E402

PINS = ["numpy==2.2.6", "safetensors==0.5.3"]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HEADS = 4
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Water boils at one hundred degrees Celsius at sea level, and",
]
POSITIONS = 4  # the last positions of each prompt whose drafts are compared
# The engine's and NumPy's logits differ by the 8-bit activation quantization (see above). With
# seed 11, 47 of the 48 drafts were equal and the other's two logits 0.04 apart (the engine's own
# lead 0.01); 0.25 leaves room for other machines' kernels and is far below a layout error's misses
# (with W transposed, 1 of 24 drafts equal).
MARGIN = 0.25
MIN_EXACT = 0.9


def run(args, env, expect_ok=True):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                       timeout=300)
    if expect_ok and r.returncode != 0:
        fail(f"{' '.join(map(str, args))} exited with {r.returncode}:\n{r.stderr}")
    return r


def check_config(config):
    want = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": 576,
        "vocab_size": 49152,
        "truncated_vocab_size": 49152,
        "num_heads": HEADS,
        "num_hidden_layers": 1,
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "max_paths": 64,
        "topk": 10,
        "torch_dtype": "float16",
    }
    check(config == want, f"config.json is {config}, expected {want}")


def check_tensors(tensors, metadata, np):
    names = {f"blocks.{k}.layers.0.{p}" for k in range(HEADS) for p in ("weight", "bias")}
    names.add("lm_heads.0.weight")
    check(set(tensors) == names, f"tensor names {sorted(tensors)}, expected {sorted(names)}")
    for k in range(HEADS):
        w = tensors[f"blocks.{k}.layers.0.weight"]
        b = tensors[f"blocks.{k}.layers.0.bias"]
        check(w.shape == (576, 576) and w.dtype == np.float32, f"block {k} weight {w.shape} {w.dtype}")
        check(b.shape == (576,) and b.dtype == np.float32, f"block {k} bias {b.shape} {b.dtype}")
        check(float(np.abs(w).max()) > 0 and float(np.abs(b).max()) > 0, f"block {k} is zero")
    lm = tensors["lm_heads.0.weight"]
    check(lm.shape == (49152, 576) and lm.dtype == np.float16, f"lm_heads.0.weight {lm.shape} "
          f"{lm.dtype}, expected (49152, 576) float16")
    check(bool(np.isfinite(lm).all()), "the LM head holds a non-finite value")
    check(metadata.get("format") == "pt", f"__metadata__ {metadata}: format must be pt")
    check(metadata.get("tokenfab.head") == "export-medusa", f"__metadata__ {metadata}")


def numpy_drafts(tensors, hidden, np):
    """(K,) draft ids and (K, vocab) logits of vLLM's Medusa forward on one hidden row."""
    lm = tensors["lm_heads.0.weight"].astype(np.float32)
    h = np.asarray(hidden, dtype=np.float32)
    logits = []
    for k in range(HEADS):
        w = tensors[f"blocks.{k}.layers.0.weight"]
        b = tensors[f"blocks.{k}.layers.0.bias"]
        u = w @ h + b  # nn.Linear: x W^T + b, with W stored out x in
        z = h + u / (1.0 + np.exp(-u))
        logits.append(lm @ z)
    logits = np.stack(logits)
    return logits.argmax(axis=1), logits


def check_drafts(tensors, probe_rows, np):
    total = exact = 0
    worst = 0.0
    for row in probe_rows:
        ids, logits = numpy_drafts(tensors, row["hidden"], np)
        for k, engine in enumerate(row["drafts"]):
            total += 1
            if int(ids[k]) == engine:
                exact += 1
                continue
            behind = float(logits[k].max() - logits[k][engine])
            worst = max(worst, behind)
            print(f"near-tie: prompt {row['prompt']} position {row['position']} head {k}: engine "
                  f"{engine} (its lead {row['engine_gap'][k]:.4f}), NumPy {int(ids[k])} "
                  f"({behind:.4f} ahead)")
            check(behind <= MARGIN and row["engine_gap"][k] <= MARGIN,
                  f"prompt {row['prompt']} position {row['position']} head {k}: the engine drafted "
                  f"{engine}, NumPy {int(ids[k])}, whose logit leads the engine's token's by "
                  f"{behind:.4f} (engine's own lead {row['engine_gap'][k]:.4f}; margin {MARGIN})")
    check(exact >= MIN_EXACT * total, f"only {exact} of {total} drafts equal the engine's")
    print(f"{exact} of {total} drafts equal; differing ones within {worst:.4f} of NumPy's best")


def run_tests(cli, probe):
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file

    model = model_path(MODEL_FILE)
    with tempfile.TemporaryDirectory(prefix="tokenfab-export-") as tmp:
        tmp = pathlib.Path(tmp)
        env = dict(os.environ, TOKENFAB_HOME=str(tmp / "home"))
        made = json.loads(run([probe, "make-head", "--model", model, "--name", "export-medusa",
                               "--heads", HEADS, "--seed", 11], env).stdout)
        run([probe, "make-head", "--model", model, "--name", "export-mtp", "--type", "mtp",
             "--heads", 2], env)

        # Without --model: the registered model the head was trained on.
        out = tmp / "medusa"
        r = run([cli, "heads", "export", "export-medusa", "--format", "medusa-hf", "--out", out],
                env)
        check(sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"],
              f"{out} holds {sorted(p.name for p in out.iterdir())}")
        check_config(json.loads((out / "config.json").read_text()))
        tensors = load_file(str(out / "model.safetensors"))
        with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
            metadata = f.metadata() or {}
        check_tensors(tensors, metadata, np)

        rows = json.loads(run([probe, "drafts", "--model", model, "--head", made["file"],
                               "--positions", POSITIONS, *sum((["--prompt", p] for p in PROMPTS),
                                                              [])], env).stdout)["rows"]
        check(len(rows) == POSITIONS * len(PROMPTS), f"{len(rows)} probe rows")
        check_drafts(tensors, rows, np)

        # An earlier export is replaced only with --force; other files are never overwritten.
        r = run([cli, "heads", "export", "export-medusa", "--format", "medusa-hf", "--out", out,
                 "--model", model], env, expect_ok=False)
        check(r.returncode != 0 and "--force" in r.stderr, f"re-export without --force: {r.stderr}")
        run([cli, "heads", "export", "export-medusa", "--format", "medusa-hf", "--out", out,
             "--force"], env)
        (out / "notes.txt").write_text("mine")
        r = run([cli, "heads", "export", "export-medusa", "--format", "medusa-hf", "--out", out,
                 "--force"], env, expect_ok=False)
        check(r.returncode != 0 and "notes.txt" in r.stderr, f"a foreign file: {r.stderr}")

        # mtp: one clear error, nothing written.
        mtp_out = tmp / "mtp"
        r = run([cli, "heads", "export", "export-mtp", "--format", "medusa-hf", "--out", mtp_out],
                env, expect_ok=False)
        check(r.returncode != 0 and "vLLM has no format for it" in r.stderr,
              f"mtp export: rc {r.returncode}, {r.stderr}")
        check(r.stderr.count("\n") == 1, f"mtp export: more than one line: {r.stderr}")
        check(not mtp_out.exists(), f"{mtp_out} was created for a refused export")

        r = run([cli, "heads", "export", "no-such-head", "--format", "medusa-hf", "--out",
                 tmp / "none"], env, expect_ok=False)
        check(r.returncode != 0 and "no head 'no-such-head'" in r.stderr, r.stderr)

        # The default format is the head's GGUF file, as before.
        gguf = tmp / "copy.gguf"
        run([cli, "heads", "export", "export-medusa", "--out", gguf], env)
        check(gguf.read_bytes()[:4] == b"GGUF", f"{gguf} is not a GGUF file")
    print("PASS")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="the tokenfab-cli binary")
    parser.add_argument("--probe", required=True, help="the tokenfab-medusa-probe binary")
    parser.add_argument("--venv", required=True, help="where the pinned packages are installed")
    args = parser.parse_args()
    if not model_path(MODEL_FILE).exists():
        fail(f"{model_path(MODEL_FILE)} is missing; fetch it with `tokenfab-cli fetch`")
    if os.environ.get("TOKENFAB_EXPORT_TEST_IN_VENV") != "1":
        python = ensure_venv(pathlib.Path(args.venv), PINS)
        env = dict(os.environ, TOKENFAB_EXPORT_TEST_IN_VENV="1")
        os.execve(str(python), [str(python), __file__, *sys.argv[1:]], env)
    run_tests(args.cli, args.probe)


if __name__ == "__main__":
    main()

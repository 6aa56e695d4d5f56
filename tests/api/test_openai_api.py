#!/usr/bin/env python3
"""`tokenfab-cli serve` driven by the official `openai` Python client (and httpx for a raw stream).

Starts the server on a free loopback port with the embedded model, then checks: the model list;
a chat completion, and its streamed twin (same id and created on every chunk, the role first,
finish_reason last, usage when asked) whose deltas join to the same greedy text as
`tokenfab-cli generate --chat … --temperature 0 --json`; a text completion; stop strings
(streamed and not); a seed giving the same sampled text twice; errors raised as the client's own
classes (BadRequestError, NotFoundError, AuthenticationError against a second server with a key);
a client that leaves mid-stream, whose request the server cancels (its log says so) while the
next requests complete; and 429 (RateLimitError) beyond --max-queued.

The packages are pinned below and installed into a virtual environment (--venv) on the first run;
that needs PyPI. Usage: test_openai_api.py --cli build/bin/tokenfab-cli --venv build/api-venv
"""

import argparse
import atexit
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# openai 3.x talks through httpx2; httpx drives the raw stream of the disconnect check.
PINS = ["openai==3.51.0", "httpx2==2.17.0", "httpx==0.28.1"]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CTX = 512
THREADS = "2"
MESSAGE = "What is the capital of France? Answer in one sentence."


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def ensure_venv(venv: pathlib.Path) -> pathlib.Path:
    python = venv / "bin" / "python"
    marker = venv / "tokenfab-pins.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(PINS):
        return python
    if not python.exists():
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"python3 -m venv {venv} failed (is python3-venv installed?):\n{r.stderr}")
    r = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        *PINS], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"pip could not install {' '.join(PINS)} into {venv} (this test needs PyPI):\n"
             f"{r.stdout}{r.stderr}")
    marker.write_text("\n".join(PINS))
    return python


def model_path() -> pathlib.Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "tokenfab" / "models" / MODEL_FILE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUNNING = []  # servers to kill when the test ends early (a failed check exits at once)


@atexit.register
def kill_servers():
    for proc in RUNNING:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Server:
    """`tokenfab-cli serve` on a free loopback port, its stderr in a file."""

    def __init__(self, cli, extra=()):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tokenfab-serve-", suffix=".log")
        self.proc = subprocess.Popen(
            [cli, "--log-level", "info", "serve", "--port", str(self.port), "--threads", THREADS,
             "--ctx", str(CTX), *extra],
            stdout=subprocess.DEVNULL, stderr=self.log)
        RUNNING.append(self.proc)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail(f"tokenfab-cli serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if json.load(r) == {"status": "ok"}:
                        return
            except OSError:
                time.sleep(0.2)
        fail(f"the server did not answer /health within 60 s:\n{self.log_text()}")

    def log_text(self):
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()

    def stop(self):
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("the server did not stop within 30 s of SIGTERM")
        if code != 0:
            fail(f"the server exited with {code} after SIGTERM:\n{self.log_text()}")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def check(condition, message):
    if not condition:
        fail(message)


def run_tests(cli):
    import httpx
    import openai

    server = Server(cli)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    model_id = pathlib.Path(MODEL_FILE).stem
    passed = []

    def ok(name):
        passed.append(name)
        print(f"ok  {name}", flush=True)

    models = client.models.list()
    check([m.id for m in models.data] == [model_id], f"models: {models}")
    ok("GET /v1/models lists the loaded model")

    messages = [{"role": "user", "content": MESSAGE}]
    chat = client.chat.completions.create(model=model_id, messages=messages, max_tokens=24,
                                          temperature=0)
    text = chat.choices[0].message.content
    check(chat.object == "chat.completion" and chat.id.startswith("chatcmpl-"), f"{chat}")
    check(chat.choices[0].message.role == "assistant" and text, f"{chat}")
    check(chat.choices[0].finish_reason in ("stop", "length"), f"{chat}")
    u = chat.usage
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens > 0,
          f"usage {u}")
    ok("chat completion")

    chunks = list(client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    check(len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1,
          "every chunk has the same id and created")
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    with_choices = [c for c in chunks if c.choices]
    streamed = "".join(c.choices[0].delta.content or "" for c in with_choices)
    check(with_choices[-1].choices[0].finish_reason == chat.choices[0].finish_reason,
          f"last chunk {with_choices[-1]}")
    check(all(c.choices[0].finish_reason is None for c in with_choices[:-1]),
          "finish_reason only on the last chunk")
    check(chunks[-1].usage is not None and not chunks[-1].choices, f"usage chunk {chunks[-1]}")
    check(chunks[-1].usage.completion_tokens == u.completion_tokens, f"{chunks[-1].usage} vs {u}")
    check(streamed == text, f"streamed {streamed!r} != non-streamed {text!r}")
    ok("streamed chat completion equals the non-streamed one, with usage")

    gen = subprocess.run([cli, "generate", "--chat", MESSAGE, "--temperature", "0",
                          "--max-tokens", "24", "--threads", THREADS, "--json"],
                         capture_output=True, text=True, timeout=120)
    check(gen.returncode == 0, f"generate failed: {gen.stderr}")
    check(json.loads(gen.stdout)["text"] == streamed,
          f"generate {json.loads(gen.stdout)['text']!r} != streamed {streamed!r}")
    ok("greedy streamed text equals tokenfab-cli generate's")

    prompt = "The three primary colors are"
    comp = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
    full = comp.choices[0].text
    check(comp.object == "text_completion" and full, f"{comp}")
    ok("text completion")

    ids = post(server.url + "/tokenize", {"content": prompt})["tokens"]
    check(post(server.url + "/detokenize", {"tokens": ids})["content"] == prompt,
          "/tokenize then /detokenize gives the text back")
    ok("/tokenize and /detokenize")

    # A stop string taken from the greedy text itself: the reply ends just before it.
    words = [w for w in full.split(" ") if w.strip()]
    check(len(words) >= 3, f"completion too short to pick a stop string: {full!r}")
    stop = " " + words[2]
    expected = full[:full.index(stop)]
    stopped = client.completions.create(model=model_id, prompt=prompt, max_tokens=24,
                                        temperature=0, stop=[stop, "\u2603never"])
    check(stopped.choices[0].text == expected and stopped.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {stopped.choices[0]!r}, expected {expected!r}")
    streamed_stop = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True)
        if c.choices)
    check(streamed_stop == expected, f"streamed stop: {streamed_stop!r}, expected {expected!r}")
    ok("stop strings end the reply before them, streamed or not")

    sampled = [client.chat.completions.create(model=model_id, messages=messages, max_tokens=16,
                                              temperature=1.0, seed=1234)
               .choices[0].message.content for _ in range(2)]
    check(sampled[0] == sampled[1], f"seed 1234 gave {sampled}")
    ok("the same seed samples the same text")

    def expect(error_class, call, *needles):
        try:
            call()
        except error_class as e:
            for n in needles:
                check(n in str(e), f"{error_class.__name__} without {n!r}: {e}")
            return e
        fail(f"expected {error_class.__name__}")

    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=4,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools")
    check(e.body and e.body.get("param") == "tools", f"param: {e.body}")
    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=4, n=2), "n")
    long_prompt = "hello " * (CTX + 50)
    n_long = len(post(server.url + "/tokenize", {"content": long_prompt, "add_special": True})
                 ["tokens"])
    check(n_long > CTX, f"/tokenize counts {n_long} tokens")
    expect(openai.BadRequestError, lambda: client.completions.create(
        model=model_id, prompt=long_prompt, max_tokens=4), f"{CTX} tokens", f"{n_long} tokens")
    expect(openai.NotFoundError, lambda: client.chat.completions.create(
        model="gpt-4o", messages=messages, max_tokens=4), "gpt-4o")
    ok("errors are the client's BadRequestError and NotFoundError, naming the field")

    # A client that leaves mid-stream: the server cancels its request; later requests complete.
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": CTX - 16,
            "temperature": 0.8, "stream": True}
    with httpx.Client(timeout=60) as raw:
        with raw.stream("POST", server.url + "/v1/completions", json=body) as r:
            check(r.status_code == 200, f"stream status {r.status_code}")
            lines = 0
            for line in r.iter_lines():
                lines += line.startswith("data: ")
                if lines >= 3:
                    break
    deadline = time.time() + 30
    while "the client went away" not in server.log_text():
        check(time.time() < deadline, "no log line says the left stream was cancelled:\n"
              + server.log_text())
        time.sleep(0.1)
    after = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
    check(after.choices[0].text == full, "a request after the disconnect")
    ok("a client that leaves mid-stream cancels its request; the server goes on")
    server.stop()

    keyed = Server(cli, ["--api-key", "s3cret-key", "--max-queued", "1"])
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: wrong.models.list())
    right = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret-key", max_retries=0)
    check([m.id for m in right.models.list().data] == [model_id], "the right key")
    req = urllib.request.Request(keyed.url + "/v1/models", headers={"X-Api-Key": "s3cret-key"})
    with urllib.request.urlopen(req, timeout=10) as r:
        check(r.status == 200, "X-Api-Key")
    ok("a server with --api-key refuses a wrong key (AuthenticationError), takes the right one")

    # --max-queued 1: while one stream is open, another request is refused with 429.
    with httpx.Client(timeout=60, headers={"Authorization": "Bearer s3cret-key"}) as raw:
        with raw.stream("POST", keyed.url + "/v1/completions", json=body) as r:
            check(r.status_code == 200, f"stream status {r.status_code}")
            next(r.iter_lines())
            expect(openai.RateLimitError, lambda: right.completions.create(
                model=model_id, prompt=prompt, max_tokens=4), "--max-queued")
    deadline = time.time() + 30
    while True:  # the slot is free once the server has seen the stream's client leave
        try:
            right.completions.create(model=model_id, prompt=prompt, max_tokens=4)
            break
        except openai.RateLimitError:
            check(time.time() < deadline, "the slot of a closed stream was never freed")
            time.sleep(0.1)
    keyed.stop()
    ok("beyond --max-queued a request gets RateLimitError (429); the slot frees after")
    print(f"{len(passed)} checks passed", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="the tokenfab-cli binary")
    parser.add_argument("--venv", required=True, help="where the pinned packages are installed")
    args = parser.parse_args()
    if not model_path().exists():
        fail(f"{model_path()} is missing; fetch it with `tokenfab-cli fetch`")
    if os.environ.get("TOKENFAB_API_TEST_IN_VENV") != "1":
        python = ensure_venv(pathlib.Path(args.venv))
        env = dict(os.environ, TOKENFAB_API_TEST_IN_VENV="1")
        os.execve(str(python), [str(python), __file__, *sys.argv[1:]], env)
    run_tests(args.cli)


if __name__ == "__main__":
    main()

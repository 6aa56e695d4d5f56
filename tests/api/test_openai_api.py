#!/usr/bin/env python3
"""`tokenfab-cli serve` driven by the official `openai` Python client (and httpx for a raw stream).

Starts the server on a free loopback port with the embedded model, then checks: the model list;
a chat completion, and its streamed twin (same id and created on every chunk, the role first,
finish_reason last, usage when asked) whose deltas join to the same greedy text as
`tokenfab-cli generate --chat … --temperature 0 --json`; a text completion; stop strings
(streamed and not); a seed giving the same sampled text twice; errors raised as the client's own
classes (BadRequestError, NotFoundError, AuthenticationError against a second server with a key);
log-probabilities (chat and completions, streamed and not: one entry per token, the greedy token
the most probable, the tokens' bytes joining to the text); the `tokenfab` extension (context lookup
drafts: the same greedy text, an ACCEPT/STEP figure); /metrics parsed by prometheus_client (the
counters agree with what the test did); 64 concurrent streaming clients, each with every token;
a client that leaves mid-stream, whose request the server cancels (its log says so) and whose KV
blocks are free at once (/metrics), while the next requests complete; 429 (RateLimitError) beyond
--max-queued, also under a flood, after which the server still serves; and CORS for the origins
given only.

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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from script_support import check, ensure_venv, fail, model_path  # noqa: E402

# openai 3.x talks through httpx2; httpx drives the raw stream of the disconnect check.
# prometheus_client parses /metrics as Prometheus would.
PINS = ["openai==3.51.0", "httpx2==2.17.0", "httpx==0.28.1", "prometheus-client==0.26.0"]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CTX = 512
THREADS = "2"
MESSAGE = "What is the capital of France? Answer in one sentence."


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


def metrics(url, headers=None):
    """GET /metrics parsed by prometheus_client: {(sample name, frozen labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families
    req = urllib.request.Request(url + "/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            out[(sample.name, frozenset(labels.items()))] = sample.value
    return out


def metric(values, name, **labels):
    return values.get((name, frozenset(labels.items())))


def run_tests(cli):
    import concurrent.futures

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

    # ignore_eos (vLLM's and llama-server's extension): max_tokens exactly, even where the greedy
    # chat reply above ends at an end-of-generation token; that token has no text.
    long_chat = client.chat.completions.create(model=model_id, messages=messages, max_tokens=40,
                                               temperature=0, extra_body={"ignore_eos": True})
    check(long_chat.usage.completion_tokens == 40 and long_chat.choices[0].finish_reason == "length",
          f"ignore_eos: {long_chat}")
    check(long_chat.choices[0].message.content.startswith(text), "ignore_eos changed the reply")
    ok("ignore_eos generates max_tokens")

    # Log-probabilities: one entry per output token (the end-of-generation token left out), the
    # greedy token the most probable of its row, the tokens' bytes joining to the text.
    lp_chat = client.chat.completions.create(model=model_id, messages=messages, max_tokens=24,
                                             temperature=0, logprobs=True, top_logprobs=3)
    content = lp_chat.choices[0].logprobs.content
    n_out = lp_chat.usage.completion_tokens
    eog = lp_chat.choices[0].finish_reason == "stop"
    check(len(content) == n_out - (1 if eog else 0), f"{len(content)} entries for {n_out} tokens")
    for e in content:
        check(len(e.top_logprobs) == 3 and e.logprob <= 0, f"entry {e}")
        check(e.top_logprobs[0].bytes == e.bytes and abs(e.top_logprobs[0].logprob - e.logprob)
              < 1e-6, f"the greedy token is not its row's most probable: {e}")
        check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob,
              f"alternatives out of order: {e}")
    check(bytes(b for e in content for b in e.bytes).decode() == lp_chat.choices[0].message.content,
          "the tokens' bytes join to the text")
    check(lp_chat.choices[0].message.content == text, "logprobs do not change the greedy text")
    lp_chunks = list(client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=24, temperature=0, logprobs=True,
        top_logprobs=3, stream=True))
    streamed_lp = [e for c in lp_chunks if c.choices and c.choices[0].logprobs
                   for e in c.choices[0].logprobs.content]
    check([(e.token, round(e.logprob, 5)) for e in streamed_lp] ==
          [(e.token, round(e.logprob, 5)) for e in content], "streamed logprobs differ")
    lp_comp = client.completions.create(model=model_id, prompt=prompt, max_tokens=24,
                                        temperature=0, logprobs=2)
    lp = lp_comp.choices[0].logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset),
          f"completion logprobs {lp}")
    check("".join(lp.tokens) == full and lp.text_offset[0] == 0, f"tokens {lp.tokens}")
    check(all(len(t) == 2 for t in lp.top_logprobs), f"top_logprobs {lp.top_logprobs}")
    ok("logprobs and top_logprobs: chat and completions, streamed and not")

    # The tokenfab extension: context lookup drafts are lossless and report ACCEPT/STEP.
    looked = post(server.url + "/v1/completions",
                  {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                   "tokenfab": {"lookup": 3}})
    check(looked["choices"][0]["text"] == full, f"lookup changed the text: {looked}")
    check(looked["tokenfab"]["accept_per_step"] is not None and
          looked["tokenfab"]["head_switches"] == [], f"tokenfab figures {looked['tokenfab']}")
    ok("tokenfab.lookup: the same greedy text, with ACCEPT/STEP")

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
    # Its blocks are free at once: with nothing else running, no block is owned.
    deadline = time.time() + 10
    while True:
        m = metrics(server.url)
        owned = metric(m, "tokenfab:kv_cache_blocks", device="cpu:0", state="owned")
        running = metric(m, "tokenfab:num_requests_running", device="cpu:0")
        if owned == 0 and running == 0:
            break
        check(time.time() < deadline, f"after the disconnect: {owned} blocks owned, {running} "
              "running")
        time.sleep(0.1)
    check(metric(m, "tokenfab:request_success_total", finished_reason="abort") >= 1,
          "the cancelled stream counts as aborted")
    after = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
    check(after.choices[0].text == full, "a request after the disconnect")
    ok("a client that leaves mid-stream cancels its request, its blocks free at once (/metrics)")

    # /metrics as Prometheus reads it: the counters agree with the requests above.
    m = metrics(server.url)
    generated = metric(m, "tokenfab:generation_tokens_total")
    ended = sum(metric(m, "tokenfab:request_success_total", finished_reason=r) or 0
                for r in ("stop", "length", "abort"))
    check(generated and generated >= 24 * 4, f"generation tokens {generated}")
    check(metric(m, "tokenfab:prompt_tokens_total") > 0, "prompt tokens")
    check(metric(m, "tokenfab:request_success_total", finished_reason="stop") >= 2,
          "the stop-string requests count as stop")
    ttft_count = metric(m, "tokenfab:time_to_first_token_seconds_count")
    check(ttft_count and 0 < ttft_count <= ended, f"TTFT count {ttft_count}, ended {ended}")
    check(metric(m, "tokenfab:time_to_first_token_seconds_bucket", le="+Inf") == ttft_count,
          "the +Inf bucket holds every TTFT")
    check(metric(m, "tokenfab:inter_token_latency_seconds_count") > 0, "ITL samples")
    check(metric(m, "tokenfab:spec_decode_num_drafts_total", head="lookup") > 0,
          "the lookup request's drafts are counted")
    usage = metric(m, "tokenfab:kv_cache_usage_perc", device="cpu:0")
    check(usage is not None and 0 <= usage <= 1, f"kv usage {usage}")
    ok("/metrics parses with prometheus_client; its counters match the requests")

    # 64 concurrent streaming clients: every one gets every token of its reply.

    def one_stream(i):
        count, text_parts, usage_tokens, finish = 0, [], None, None
        for c in client.completions.create(
                model=model_id, prompt=f"Item {i}: a short note about the number {i} is",
                max_tokens=16, temperature=0, logprobs=0, stream=True,
                stream_options={"include_usage": True}):
            if c.usage is not None:
                usage_tokens = c.usage.completion_tokens
            for ch in c.choices:
                text_parts.append(ch.text)
                if ch.logprobs:
                    count += len(ch.logprobs.tokens)
                finish = ch.finish_reason or finish
        return count, usage_tokens, finish

    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one_stream, range(64)))
    for i, (count, usage_tokens, finish) in enumerate(results):
        check(usage_tokens is not None and finish in ("stop", "length"), f"client {i}: {finish}")
        expected_count = usage_tokens - (1 if finish == "stop" else 0)
        check(count == expected_count, f"client {i}: {count} tokens streamed, usage says "
              f"{usage_tokens} ({finish})")
        check(finish == "stop" or usage_tokens == 16, f"client {i}: {usage_tokens} tokens")
    ok("64 concurrent streaming clients all complete with every token")
    server.stop()

    keyed = Server(cli, ["--api-key", "s3cret-key", "--max-queued", "1",
                         "--cors-origin", "http://localhost:3000"])
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: wrong.models.list())
    right = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret-key", max_retries=0)
    check([m.id for m in right.models.list().data] == [model_id], "the right key")
    req = urllib.request.Request(keyed.url + "/v1/models", headers={"X-Api-Key": "s3cret-key"})
    with urllib.request.urlopen(req, timeout=10) as r:
        check(r.status == 200, "X-Api-Key")
    ok("a server with --api-key refuses a wrong key (AuthenticationError), takes the right one")

    # CORS: the preflight needs no key; only the given origin is allowed.
    pre = urllib.request.Request(keyed.url + "/v1/chat/completions", method="OPTIONS",
                                 headers={"Origin": "http://localhost:3000",
                                          "Access-Control-Request-Method": "POST"})
    with urllib.request.urlopen(pre, timeout=10) as r:
        check(r.status == 204 and r.headers["Access-Control-Allow-Origin"] ==
              "http://localhost:3000" and "POST" in r.headers["Access-Control-Allow-Methods"],
              f"preflight {r.status} {dict(r.headers)}")
    for origin, allowed in (("http://localhost:3000", True), ("http://evil.example", False)):
        req = urllib.request.Request(keyed.url + "/v1/models",
                                     headers={"X-Api-Key": "s3cret-key", "Origin": origin})
        with urllib.request.urlopen(req, timeout=10) as r:
            got = r.headers.get("Access-Control-Allow-Origin")
            check((got == origin) if allowed else got is None, f"origin {origin}: {got}")
    ok("CORS: the preflight answers without a key; only --cors-origin is allowed")

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

    # A flood: 40 requests at once against 4 slots. Some get 429, the others complete, and the
    # server goes on serving.
    flooded = Server(cli, ["--max-queued", "4"])
    flood_client = openai.OpenAI(base_url=flooded.url + "/v1", api_key="unused", max_retries=0,
                                 timeout=120)

    def flood_one(i):
        try:
            r = flood_client.completions.create(model=model_id, prompt=f"Flood {i}:",
                                                max_tokens=8, temperature=0)
            return r.usage.completion_tokens
        except openai.RateLimitError:
            return "429"

    with concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool:
        outcomes = list(pool.map(flood_one, range(40)))
    refused = outcomes.count("429")
    check(refused > 0 and refused < 40, f"flood outcomes {outcomes}")
    check(all(o == "429" or (isinstance(o, int) and o > 0) for o in outcomes), f"{outcomes}")
    after = flood_client.completions.create(model=model_id, prompt=prompt, max_tokens=24,
                                            temperature=0)
    check(after.choices[0].text == full, "the server serves after the flood")
    flooded.stop()
    ok(f"a flood of 40 against --max-queued 4: {refused} refused with 429, the rest complete")
    print(f"{len(passed)} checks passed", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="the tokenfab-cli binary")
    parser.add_argument("--venv", required=True, help="where the pinned packages are installed")
    args = parser.parse_args()
    if not model_path(MODEL_FILE).exists():
        fail(f"{model_path(MODEL_FILE)} is missing; fetch it with `tokenfab-cli fetch`")
    if os.environ.get("TOKENFAB_API_TEST_IN_VENV") != "1":
        python = ensure_venv(pathlib.Path(args.venv), PINS)
        env = dict(os.environ, TOKENFAB_API_TEST_IN_VENV="1")
        os.execve(str(python), [str(python), __file__, *sys.argv[1:]], env)
    run_tests(args.cli)


if __name__ == "__main__":
    main()

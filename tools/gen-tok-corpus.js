// Writes testdata/tokenize/corpus.jsonl.gz: the deterministic tokenizer test corpus (>= 2 MB of
// UTF-8 text), one JSON string per line (one document per line). The Go tests and the HF oracle
// script (gen-tok-goldens.js) both read this file, so they see the same bytes.
//
// Content: prose, code, JSON, Chinese/Japanese/Korean, other scripts, emoji, whitespace runs, and
// edge cases (NBSP, U+2028, NEL, U+3000, combining marks, 10k-space runs, special tokens inside
// text, invalid-looking escapes, control characters, long words, contractions in odd cases).
// A seeded PRNG makes the output byte-identical on every run; change SEED only on purpose.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

const SEED = 0x6b766761; // "kvga"
const TARGET_BYTES = 2_300_000;

let state = SEED >>> 0;
function rnd() { // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (c) => String.fromCodePoint(c);
const range = (lo, hi) => cp(lo + ri(hi - lo + 1));
function rep(n, f) { let s = ''; for (let i = 0; i < n; i++) s += f(i); return s; }

const words = ('the of and to in is that it was for on are as with his they at be this have from or one had by word but not what ' +
  'all were we when your can said there use an each which she do how their if will up other about out many then them these so ' +
  'some her would make like him into time has look two more write go see number no way could people my than first water been ' +
  'call who oil its now find long down day did get come made may part over new sound take only little work know place year live ' +
  'me back give most very after thing our just name good sentence man think say great where help through much before line right ' +
  'too mean old any same tell boy follow came want show also around form three small set put end does another well large must big ' +
  'even such because turn here why ask went men read need land different home us move try kind hand picture again change off play ' +
  'spell air away animal house point page letter mother answer found study still learn should America world kubernetes tokenizer ' +
  'latency throughput prefill decode cache router engine inference transformer attention gradient naïve café résumé façade coöperate ' +
  'Straße déjà vu São Paulo Zürich Kraków Ångström').split(' ');
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'M", "'LL", "'Ll", "'D", "'ſ", "’s", "’ll", "'x", "'"];
const punct = '.,;:!?-()[]{}"\'/\\@#$%^&*_+=<>|~`'.split('');

function sentence() {
  const n = 4 + ri(18);
  let s = '';
  for (let i = 0; i < n; i++) {
    let w = pick(words);
    const r = rnd();
    if (i === 0 || r < 0.05) w = w[0].toUpperCase() + w.slice(1);
    else if (r < 0.08) w = w.toUpperCase();
    if (rnd() < 0.08) w += pick(contractions);
    if (rnd() < 0.05) w = String(ri(100000));
    if (rnd() < 0.02) w = (ri(1e6) / 100).toFixed(2);
    if (rnd() < 0.02) w = ri(1000) + ',' + String(1000 + ri(9000)).slice(1);
    if (rnd() < 0.04) w = '"' + w + '"';
    if (rnd() < 0.03) w = '(' + w + ')';
    s += (i ? ' ' : '') + w;
    if (rnd() < 0.07) s += pick([',', ';', ':', ' -', ' —', '...']);
  }
  return s + pick(['.', '.', '.', '!', '?', '?!', '...', '']);
}
function prose() {
  let s = '';
  const paras = 1 + ri(5);
  for (let p = 0; p < paras; p++) {
    s += rep(2 + ri(6), () => sentence() + ' ').trimEnd();
    s += pick(['\n\n', '\n', '\r\n\r\n', '\n\n\n', '  \n', '\n \n', ' ']);
  }
  return s;
}

const idents = ['x', 'i', 'n', 'buf', 'ctx', 'err', 'self', 'value', 'tokenIDs', 'maxLen', 'HTTPServer', 'parse_json', '_private', '__init__', 'αβγ', 'データ'];
function codeLine(lang, depth) {
  const ind = lang === 'go' ? '\t'.repeat(depth) : ' '.repeat(depth * pick([2, 4, 4, 8]));
  const a = pick(idents), b = pick(idents);
  const forms = {
    go: [`${a} := ${b}[${ri(64)}:]`, `if err != nil {\n${ind}\treturn nil, fmt.Errorf("bad %q: %w", ${a}, err)\n${ind}}`,
      `for i := 0; i < len(${a}); i++ {`, `}`, `// ${sentence()}`, `${a} = append(${a}[:0], ${b}...)`, `x <<= ${ri(32)}; y &^= 0x${ri(65535).toString(16)}`],
    py: [`def ${a}(${b}, *args, **kwargs):`, `return [${a} for ${a} in ${b} if ${a} % ${1 + ri(9)} == 0]`, `# ${sentence()}`,
      `print(f"{${a}!r:>10} {${b}:.3f}")`, `${a} = {'k': ${ri(99)}, "v": None, 'x': True}`, `raise ValueError("${pick(words)}\\n")`, `"""${sentence()}"""`],
    js: [`const ${a} = async (${b}) => { await ${b}?.then(x => x ?? null); };`, `/* ${sentence()} */`, `${a} === ${b} && !${a} || ${b} !== void 0`,
      '`template ${' + a + '} and ${' + b + '}`', `export default function ${a}() {`, `}`, `let re = /\\s+(?!\\S)|[\\p{L}]+/gu;`],
    c: [`#include <stdio.h>`, `int ${a}(char *${b}, size_t n) {`, `for (int i = 0; i < n; ++i) ${b}[i] ^= 0x${ri(255).toString(16)};`,
      `printf("%d\\t%s\\n", ${ri(1000)}, ${b});`, `}`, `#define MAX(a, b) ((a) > (b) ? (a) : (b))`, `unsigned long long h = 14695981039346656037ULL;`],
  };
  return ind + pick(forms[lang]);
}
function code() {
  const lang = pick(['go', 'py', 'js', 'c']);
  let s = pick(['', '```' + lang + '\n']);
  let depth = 0;
  const n = 5 + ri(40);
  for (let i = 0; i < n; i++) {
    s += codeLine(lang, depth) + pick(['\n', '\n', '\n', '\n\n', '\r\n', '  \n']);
    depth = Math.max(0, Math.min(5, depth + pick([-1, 0, 0, 1])));
  }
  return s + pick(['', '```\n']);
}

function jsonValue(d) {
  const r = rnd();
  if (d > 3 || r < 0.3) return pick([ri(1e6), -ri(1000) / 7, true, false, null, sentence(), pick(words), 'ünïcödé \u00e9', '中文字符', '\\u00e9 escaped', 'tab\there', '😀']);
  if (r < 0.6) return Array.from({ length: ri(5) }, () => jsonValue(d + 1));
  const o = {};
  for (let i = 0; i < 1 + ri(6); i++) o[pick(idents) + (i ? i : '')] = jsonValue(d + 1);
  return o;
}
function json() {
  const v = { id: 'chatcmpl-' + ri(1e9).toString(36), model: pick(['qwen3', 'llama-3.1-8b', 'gemma-3']), data: jsonValue(0) };
  const r = rnd();
  if (r < 0.3) return JSON.stringify(v);
  if (r < 0.5) return JSON.stringify(v, null, 2);
  if (r < 0.7) return JSON.stringify(v, null, '\t');
  return JSON.stringify(v, null, 4).replace(/[^\x00-\x7f]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

const hanCommon = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴';
const cjkPunct = '，。！？、；：「」『』（）《》【】…—～·';
function chinese() {
  let s = '';
  const n = 20 + ri(400);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.8) s += pick(hanCommon);
    else if (r < 0.9) s += pick(cjkPunct);
    else if (r < 0.93) s += String(ri(10000));
    else if (r < 0.95) s += ' ' + pick(words) + ' ';
    else if (r < 0.96) s += range(0x3400, 0x4dbf); // Ext A
    else if (r < 0.97) s += range(0x20000, 0x2a6df); // Ext B
    else if (r < 0.98) s += range(0x9fa6, 0x9fff); // beyond DeepSeek's \u9fa5 class
    else s += pick(['\n', '\n\n', '　', ' ']);
  }
  return s;
}
function japanese() {
  let s = '';
  const n = 20 + ri(300);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.35) s += range(0x3041, 0x3096);
    else if (r < 0.6) s += range(0x30a1, 0x30fa);
    else if (r < 0.65) s += 'ー';
    else if (r < 0.85) s += pick(hanCommon);
    else if (r < 0.9) s += pick('。、「」・々〜');
    else if (r < 0.95) s += range(0xff66, 0xff9d); // half-width katakana
    else s += pick(['\n', ' ', '　', String(ri(100))]);
  }
  return s;
}
function korean() {
  let s = '';
  const n = 20 + ri(200);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.8) s += range(0xac00, 0xd7a3);
    else if (r < 0.88) s += ' ';
    else if (r < 0.92) s += range(0x1100, 0x1112) + range(0x1161, 0x1175) + (rnd() < 0.5 ? range(0x11a8, 0x11c2) : ''); // conjoining jamo (NFC composes)
    else if (r < 0.95) s += range(0x3131, 0x318e);
    else s += pick(['.', ',', '?', '\n', String(ri(1000))]);
  }
  return s;
}
const scripts = [
  [0x0410, 0x044f], [0x0391, 0x03c9], [0x0621, 0x064a], [0x05d0, 0x05ea], [0x0905, 0x0939], [0x0e01, 0x0e30],
  [0x0b85, 0x0bb9], [0x10a0, 0x10ff], [0x0531, 0x0586], [0x1200, 0x135a], [0x0100, 0x017f], [0x0180, 0x024f],
  [0x1e00, 0x1eff], [0x13a0, 0x13f4], [0x0c05, 0x0c39], [0x1780, 0x17b3],
];
const marks = [[0x0300, 0x036f], [0x064b, 0x065f], [0x093e, 0x094d], [0x0e31, 0x0e3a], [0x05b0, 0x05bd], [0x20d0, 0x20f0], [0x1ab0, 0x1abd]];
function otherScripts() {
  let s = '';
  const n = 5 + ri(80);
  for (let w = 0; w < n; w++) {
    const [lo, hi] = pick(scripts);
    const len = 1 + ri(10);
    for (let i = 0; i < len; i++) {
      s += range(lo, hi);
      if (rnd() < 0.2) { const [ml, mh] = pick(marks); s += range(ml, mh); }
    }
    s += pick([' ', ' ', ' ', ', ', '. ', '\n', '؟ ', '। ', '-', '']);
  }
  return s;
}
const emojiBase = [0x1f600, 0x1f64f, 0x1f300, 0x1f5ff, 0x1f680, 0x1f6ff, 0x1f900, 0x1f9ff];
function emoji() {
  let s = '';
  const n = 5 + ri(60);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    const k = 2 * ri(4);
    if (r < 0.4) s += range(emojiBase[k], emojiBase[k + 1]);
    else if (r < 0.5) s += '👨‍👩‍👧‍👦';
    else if (r < 0.6) s += range(0x1f466, 0x1f469) + range(0x1f3fb, 0x1f3ff); // skin tones
    else if (r < 0.7) s += range(0x1f1e6, 0x1f1ff) + range(0x1f1e6, 0x1f1ff); // flags
    else if (r < 0.75) s += ri(10) + '\ufe0f\u20e3'; // keycap: digit + VS16 + combining enclosing keycap
    else if (r < 0.8) s += '❤️' + '\u200d🔥';
    else if (r < 0.9) s += pick(words);
    else s += pick([' ', '  ', '\n', '!', '...']);
  }
  return s;
}

const special = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>',
  '<|end_header_id|>', '<|reserved_special_token_0|>', '<|endofprompt|>', '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜User｜>',
  '<｜Assistant｜>', '<|EOT|>', '<｜tool▁calls▁begin｜>', '<｜fim▁hole｜>', '<s>', '</s>', '<unk>', '<bos>', '<eos>', '<pad>', '<start_of_turn>',
  '<end_of_turn>', '<unused0>', '<unused42>', '<mask>', '[multimodal]', '<table>', '</td>', '<h1>', '<image_soft_token>', '<think>', '</think>',
  '<tool_call>', '</tool_call>', '<|vision_start|>', '<|fim_prefix|>', '<0x0A>', '<0xFF>', '<|im_sta', 'im_end|>', '<|IM_START|>', '< s>', '<<s>>',
  '<|im_start|<|im_end|>', '<unused9999>', '<|reserved_special_token_250|>', '<|python_tag|>'];
function specials() {
  let s = '';
  const n = 3 + ri(30);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.4) s += pick(special);
    else if (r < 0.6) s += pick(special) + pick(special);
    else if (r < 0.8) s += ' ' + pick(special) + ' ';
    else if (r < 0.9) s += pick(['\n', '\n\n', '\t', '\t\t', '▁▁', '   ']) + pick(special) + pick(['\n', 'user\n', 'assistant\n']);
    else s += sentence();
    if (rnd() < 0.3) s += pick(words);
  }
  return s;
}

function escapes() {
  const e = ['\\u12', '\\uZZZZ', '\\uD83D', '\\ud83d\\ude00', '\\x', '\\x0', '\\xff', '\\N{BULLET}', '\\U0001F600', '%E2%82', '%zz', '%%',
    '&#xZZ;', '&#128512;', '&amp;', '&lt;s&gt;', '\\\\', '\\', '\\n', '\\t', '\\"', "\\'", '\\0', '\\u{1F600}', '\\e[31m', '\x1b[0m',
    '$\\frac{1}{2}$', '\\begin{equation}', 'C:\\Users\\x', '{{ var }}', '{% if x %}', '${HOME}', '`rm -rf /`'];
  return rep(5 + ri(40), () => pick(e) + pick(['', ' ', '\n', pick(words)])).trim();
}

const wsChars = [' ', ' ', ' ', '\t', '\n', '\r', '\r\n', '\u00a0', '\u2028', '\u2029', '\u0085', '\u3000', '\u2003', '\u2009', '\u202f',
  '\u205f', '\u1680', '\u000b', '\u000c', '\u200b', '\ufeff', '\u180e', '\u001c', '\u001f'];
function whitespace() {
  let s = '';
  const n = 5 + ri(60);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.4) s += rep(1 + ri(12), () => pick(wsChars));
    else if (r < 0.5) s += ' '.repeat(1 + ri(40));
    else if (r < 0.55) s += '\n'.repeat(1 + ri(40));
    else if (r < 0.6) s += '\t'.repeat(1 + ri(40));
    else s += pick(words) + pick(['', '.', '!', '?']);
  }
  return s;
}
function edge() {
  const r = ri(16);
  switch (r) {
    case 0: return ' '.repeat(10000);
    case 1: return pick(words) + ' '.repeat(10000) + pick(words);
    case 2: return '\n'.repeat(3000 + ri(7000)) + pick(words);
    case 3: return rep(10, () => ' '.repeat(ri(1000)) + '\t' + '\u00a0'.repeat(ri(50)) + '\n');
    case 4: return rep(1, () => 'e\u0301 a\u0300\u0301\u0302\u0303 \u0301start ' + 'Z' + rep(30, () => range(0x0300, 0x036f)) + ' n\u0303o A\u030a 1\u0301 ' + '\u1100\u1161\u11a8');
    case 5: return rep(200 + ri(3000), () => pick('abcdefghijklmnopqrstuvwxyz')); // one long word
    case 6: return rep(500 + ri(5000), () => String(ri(10))); // long digit run
    case 7: return pick(['!', '.', '-', '=', '*', '#', '~']).repeat(100 + ri(3000));
    case 8: return rep(50 + ri(300), () => cp(ri(32))) + rep(20, () => cp(0x7f + ri(33)));
    case 9: return rep(100, () => pick(['\ue000', '\uf8ff', '\ufffd', '\ufffe', '\uffff', cp(0x0378), cp(0x10ffff), cp(0xf0000), cp(0xe0001), cp(0xe0041)]));
    case 10: return rep(50, () => pick(['Ġ', 'Ċ', '▁', 'ĉ', 'Ã©', 'âĢĻ', '<0x41>', '▁▁hello', 'Ġthe'])) + ' ' + sentence();
    case 11: return rep(80, () => pick(['ǅ', 'ǈ', 'ǋ', 'ǲ', 'ᾈ', 'ʰ', 'ˆ', 'ー', '々', 'Ⅻ', 'ⅷ', '½', '²', '³', '٣', '१', '１２３', 'ＡＢＣ', 'ﬁ', 'ﬀ', 'Ω', 'Å', 'K', '㎏', '①', 'ｶ', '⁹', 'µ', 'İ', 'ı', 'ß', 'ẞ']) + pick(['', ' ', 'a', 'A', "'s"]));
    case 12: return rep(40, () => pick(words).toUpperCase() + pick(contractions) + pick([' ', '', '\n']));
    case 13: return 'https://example.com/path/to/' + pick(words) + '?q=' + ri(1e6) + '&lang=en#frag /usr/local/bin/kvgate ~/.config/x.yaml ' + rep(20, () => ri(16).toString(16)) + ' ' + Buffer.from(rep(40, () => cp(ri(128)))).toString('base64');
    case 14: return ['', ' ', '\n', '\t', 'a', '<s>', ' <s>', '<|im_end|>', '\u00a0', '\u3000', '\u2028', '\u0085', '\r\n', "'s", '1', '😀'][ri(16)];
    default: return rep(20, () => range(0x11f00, 0x11f5a) + range(0x1e4d0, 0x1e4f9) + range(0x2ebf0, 0x2ee5d) + range(0x10d40, 0x10d8f) + range(0x1c89, 0x1c8a) + ' ');
  }
}

const kinds = [[prose, 30], [code, 14], [json, 8], [chinese, 8], [japanese, 4], [korean, 3], [otherScripts, 7], [emoji, 5], [specials, 6],
  [escapes, 3], [whitespace, 6], [edge, 6]];
const totalW = kinds.reduce((a, k) => a + k[1], 0);
function doc() {
  let r = ri(totalW);
  for (const [f, w] of kinds) { if (r < w) return f; r -= w; }
  return prose;
}

const docs = [];
let bytes = 0;
// A few fixed documents first, so every run exercises them.
for (const d of ['', ' ', '  ', '\n', 'Hello world', ' Hello', "it's", '<|im_start|>user\nhi<|im_end|>\n', '<s> <s>', 'a'.repeat(5), ' '.repeat(10000), '\u00a0\u2028\u0085\u3000']) {
  docs.push(d); bytes += Buffer.byteLength(d);
}
while (bytes < TARGET_BYTES) {
  let d;
  if (rnd() < 0.25) { // mixed document
    d = rep(2 + ri(4), () => doc()()).trim();
  } else d = doc()();
  docs.push(d);
  bytes += Buffer.byteLength(d);
}

const out = path.join(__dirname, '..', 'testdata', 'tokenize', 'corpus.jsonl.gz');
fs.mkdirSync(path.dirname(out), { recursive: true });
const text = docs.map((d) => JSON.stringify(d)).join('\n') + '\n';
fs.writeFileSync(out, zlib.gzipSync(Buffer.from(text), { level: 9, mtime: 0 }));
console.error(`gen-tok-corpus: ${docs.length} documents, ${bytes} bytes -> ${out}`);

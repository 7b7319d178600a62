// llamacpp_logits prints llama.cpp's next-token logits for GGUF base models (each optionally with
// a GGUF LoRA adapter) at every position of a token sequence, through node-llama-cpp's prebuilt
// CPU binaries (build: "never": no compiler, no download). engine's TestLlamaCppLogits runs it:
//
//	NODE_PATH=/tmp/ggml/node_modules node scripts/llamacpp_logits.mjs JOBS.json
//
// JOBS.json: [{"model": "base.gguf", "adapter": "lora.gguf" or "", "tokens": [ids], "texts": [strings]}, …].
// Output: JSON [{"logits": [[V logits] per position], "tokenized": [[ids] per text]} per job]; the
// texts are tokenized by llama.cpp's tokenizer (no BOS added, special tokens recognised).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";

const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const require = createRequire(path.join(process.env.NODE_PATH || process.cwd(), "x.js"));
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const out = [];
for (const job of jobs) {
  const model = await llama.loadModel({ modelPath: job.model, gpuLayers: 0 });
  // A float32 KV cache (llama.cpp defaults to F16, which rounds keys and values to 11 bits).
  const opts = { contextSize: 256, batchSize: 256, threads: 1, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false };
  if (job.adapter) opts.lora = { adapters: [{ filePath: job.adapter, scale: 1 }] };
  const context = await model.createContext(opts);
  const seq = context.getSequence();
  const res = await seq.controlledEvaluate(job.tokens.map((t) => [t, { generateNext: { logits: true } }]));
  const logits = res.map((r) => {
    const m = r?.next?.logits;
    if (!m) throw new Error("llama.cpp returned no logits");
    const row = new Array(m.size);
    for (const [tok, v] of m) row[tok] = v;
    return row;
  });
  const tokenized = (job.texts || []).map((t) => Array.from(model.tokenize(t, true)));
  out.push({ logits, tokenized });
  await context.dispose();
  await model.dispose();
}
process.stdout.write(JSON.stringify(out) + "\n");
await llama.dispose();

// llama.cpp's side of bench/vs-llamacpp/run.py, through npm's node-llama-cpp (prebuilt
// llama.cpp, the CPU variant picked at run time): one round of pp and tg, as one JSON line.
//   NLC_DIR=DIR node llama_side.mjs MODEL.gguf THREADS PROMPT GEN VOCAB
// DIR holds node_modules/node-llama-cpp (npm install node-llama-cpp there).
import { pathToFileURL } from "node:url";
import path from "node:path";

const [model, threads, prompt, gen, vocab] = process.argv.slice(2);
const nlc = path.join(process.env.NLC_DIR ?? ".", "node_modules/node-llama-cpp/dist/index.js");
const { getLlama } = await import(pathToFileURL(nlc).href);

// The ids of `sinter bench llm` (bench_ids in run.py).
function benchIds(n, vocab) {
  const [skip, span] = vocab > 200 ? [100, vocab - 100] : [0, vocab];
  return Array.from({ length: n }, (_, i) => ((i * 7919 + 13) % span) + skip);
}

const T = Number(threads), P = Number(prompt), G = Number(gen);
// maxThreads 0: the context's `threads` is then exactly the threads used.
const llama = await getLlama({ gpu: false, build: "never", maxThreads: 0, logLevel: "error" });
let t = performance.now();
const m = await llama.loadModel({ modelPath: model, gpuLayers: 0 });
const ctx = await m.createContext({
  contextSize: Math.max(P, 16 + G) + 16, batchSize: P, threads: T, sequences: 1,
});
console.error(`llama.cpp (node-llama-cpp, ${llama.cpuMathCores} math cores): loaded in ${((performance.now() - t) / 1000).toFixed(2)} s`);
const seq = ctx.getSequence();
const V = Number(vocab);
const ids = benchIds(P, V);
await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, 8)); // warm-up: buffers
await seq.clearHistory();
t = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(ids);
const pp = (performance.now() - t) / 1000;
await seq.clearHistory();
t = performance.now();
let n = 0;
// yieldEogToken: an end-of-text token is evaluated and generation goes on, as in
// `sinter bench llm`, so both sides time exactly G tokens whatever the weights predict.
for await (const _ of seq.evaluate(benchIds(16, V), { temperature: 0, yieldEogToken: true })) {
  if (++n === G) break;
}
const tg = (performance.now() - t) / 1000;
if (n !== G) throw new Error(`generated ${n} tokens, not ${G}`);
console.log(JSON.stringify({
  engine: "llama.cpp", vocab: V, prompt_tokens: P, prompt_s: pp, prompt_tok_s: P / pp,
  gen_tokens: G, gen_s: tg, gen_tok_s: G / tg,
}));
await ctx.dispose(); await m.dispose(); await llama.dispose();

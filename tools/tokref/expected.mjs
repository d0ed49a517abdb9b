// Writes the reference token ids of every corpus case, as encoded by @lenml/tokenizers (a
// JavaScript port of the Hugging Face tokenizers pipeline), to a JSON-lines file:
//   line 1: {"meta": {...versions, sha256 of tokenizer.json...}}
//   then:   {"name", "text", "ids", "normalized"?}   ("normalized": the NFC text, when it differs)
// Added tokens (special or not) are always split out, as Hugging Face does by default; no BOS/EOS
// is added (add_special_tokens: false).
//
// Usage (after tools/fetch-tokenizers.sh --with-ref):
//   node tools/tokref/expected.mjs tests/data/npm/tokenizer-qwen3 \
//        tests/data/tokenizer/corpus.jsonl tests/data/tokenizer/qwen3-expected.jsonl
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const refDir = path.join(here, "..", "..", "tests", "data", "npm", "tokref");
const require = createRequire(path.join(refDir, "package.json"));

const [pkgDir, corpusPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node expected.mjs PACKAGE_DIR CORPUS.jsonl OUT.jsonl");
  process.exit(2);
}

const { TokenizerLoader } = require("@lenml/tokenizers");
const refVersion = JSON.parse(
  readFileSync(path.join(refDir, "node_modules", "@lenml", "tokenizers", "package.json"), "utf8"),
).version;
const tokPkg = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const jsonBytes = readFileSync(path.join(pkgDir, "models", "tokenizer.json"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(jsonBytes.toString("utf8")),
  tokenizerConfig: JSON.parse(readFileSync(path.join(pkgDir, "models", "tokenizer_config.json"), "utf8")),
});

const normalizer = tokenizer.normalizer;
const lines = [
  JSON.stringify({
    meta: {
      reference: `@lenml/tokenizers@${refVersion}`,
      tokenizer: `${tokPkg.name}@${tokPkg.version}`,
      tokenizer_json_sha256: createHash("sha256").update(jsonBytes).digest("hex"),
      node: process.version,
      unicode: process.versions.unicode,
      add_special_tokens: false,
    },
  }),
];
let nCases = 0;
let nIds = 0;
for (const line of readFileSync(corpusPath, "utf8").split("\n")) {
  if (line.trim() === "") continue;
  const { name, text } = JSON.parse(line);
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const entry = { name, text, ids };
  // The text the tokenizer saw after normalization (outside added tokens), for the decode check.
  const norm = normalizer ? normalizer(text) : text;
  if (norm !== text) entry.normalized = norm;
  lines.push(JSON.stringify(entry));
  nCases++;
  nIds += ids.length;
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`${outPath}: ${nCases} cases, ${nIds} ids`);

#!/usr/bin/env python3
"""compare_gptoss: strata against Hugging Face transformers on random-weight gpt-oss checkpoints
(the whole-model check of DESIGN.md §8 for the second architecture). Method: docs/hf-reference.md.

For each configuration (A: hidden 256, 4 layers, head_dim 64 with 8/2 heads, 8 experts top-4,
expert ffn 224, window 16, YaRN factor 8 over 64 positions; B: hidden 192, 3 layers, 6/3 heads
of 32, 16 experts top-4, ffn 160, window 8, plain RoPE), both alternating sliding and full
layers, it

  1. builds a random-init GptOssForCausalLM in float32 (eager attention): matrices N(0, std^2),
     biases N(0, 0.02^2), sinks N(0, 1), norm weights 1 + N(0, 0.1^2); saves it with
     save_pretrained (float experts) next to a tiny tokenizer;
  2. runs `strata convert --quant f32` and `strata logits --greedy N` on each backend of
     --strata-devices (default cpu) on prompts of random ids longer than the window, batched and
     one token at a time;
  3. compares, block by block, with transformers' logits teacher-forced on strata's tokens, and
     strata's greedy tokens with transformers' own argmax loop: max |strata - hf| / max |hf|
     <= 1e-3 in every block and the same greedy tokens (a divergence at a near-tie, top-2 gap
     within twice the measured error, is reported, not failed);
  4. writes a small reference for CI (OUT/ci-ref-gptoss/, the format of tests/data/hf-ref/).

Prints the expert tensors' saved shapes (the converter reads gate_up_proj [E, H, 2F] and
down_proj [E, F, H], gate and up interleaved) and a summary; exit 0 when the criteria hold,
1 when they fail, 2 on a setup error. Needs numpy, torch, transformers with GptOss (4.55+).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_qwen3moe  # noqa: E402
from compare_qwen3moe import (SetupError, compare_case, log, run, strata_logits,  # noqa: E402
                              tiny_tokenizer, write_tokenizer_files)

F32_TOL = 1e-3

CONFIGS = {
    "A": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
              head_dim=64, num_local_experts=8, num_experts_per_tok=4, intermediate_size=224,
              sliding_window=16, yarn=(8.0, 64)),
    "B": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
              head_dim=32, num_local_experts=16, num_experts_per_tok=4, intermediate_size=160,
              sliding_window=8, yarn=None),
}
CI_CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                 sliding_window=6, yarn=(4.0, 32))
PROMPT_LENS = [1, 7, 40, 64]


class HF(compare_qwen3moe.HF):
    """Random-init GptOssForCausalLM in float32 with eager attention (last_logits and greedy
    as for Qwen3-MoE)."""

    def __init__(self, args, cfg, vocab, std):
        import torch
        import transformers
        from transformers import GptOssConfig, GptOssForCausalLM
        self.torch = torch
        self.dev = torch.device(args.device)
        if self.dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        n_layer = cfg["num_hidden_layers"]
        kw = {k: v for k, v in cfg.items() if k != "yarn"}
        kw.update(vocab_size=vocab, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  attention_bias=True, swiglu_limit=7.0, initializer_range=std,
                  layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                               for i in range(n_layer)],
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
        if cfg["yarn"]:
            factor, orig = cfg["yarn"]
            kw["max_position_embeddings"] = int(factor * orig)
            rope = dict(rope_type="yarn", rope_theta=150000.0, factor=factor,
                        original_max_position_embeddings=orig, beta_fast=32.0, beta_slow=1.0,
                        truncate=False)
        else:
            kw["max_position_embeddings"] = 4096
            rope = dict(rope_type="default", rope_theta=150000.0)
        try:  # transformers 5.x
            conf = GptOssConfig(**kw, rope_parameters=rope)
        except TypeError:  # 4.x: rope_theta at the top, rope_scaling for yarn only
            r4 = dict(rope)
            theta = r4.pop("rope_theta")
            conf = GptOssConfig(**kw, rope_theta=theta,
                                rope_scaling=r4 if cfg["yarn"] else None)
        self.model = compare_qwen3moe.eager_model(GptOssForCausalLM, conf, args.seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name.endswith("sinks"):
                    p.normal_(0.0, 1.0)
                elif "bias" in name:
                    p.normal_(0.0, 0.02)
                elif p.dim() >= 2:
                    p.normal_(0.0, std)
                else:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        self.model.eval().to(self.dev)
        impl = getattr(self.model.config, "_attn_implementation", "?")
        if impl != "eager":
            raise SetupError(f"attention implementation is {impl}, expected eager")
        self.versions = (f"torch {torch.__version__}, transformers {transformers.__version__}"
                         f" (float32, attention {impl})")

    def save(self, path):
        self.model.save_pretrained(path)


def expert_shapes(hf_dir):
    """name -> shape of the saved expert tensors (to see the layout transformers wrote)."""
    out = {}
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    for f in files:
        with open(os.path.join(hf_dir, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            for k, v in json.loads(fh.read(n)).items():
                if k.startswith("model.layers.0.mlp.experts"):
                    out[k] = (v["dtype"], v["shape"])
    return out


def build(args, name, cfg, std, out_dir):
    """Checkpoint (HF dir with the tiny tokenizer), its f32 GGUF, and the reference."""
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    tok_json, tok_cfg, n_tok = tiny_tokenizer()
    vocab = (n_tok + 7) // 8 * 8
    ref = HF(args, cfg, vocab, std)
    ref.save(hf_dir)
    write_tokenizer_files(hf_dir, tok_json, tok_cfg)
    for k, v in expert_shapes(hf_dir).items():
        log(f"  {name}: saved {k} {v[0]} {v[1]}")
    gguf = os.path.join(out_dir, "model.gguf")
    run([args.strata, "convert", hf_dir, "-o", gguf, "--quant", "f32", "--name", f"gptoss-{name}",
         "-q"], f"strata convert ({name})")
    return ref, gguf, vocab


def prompts(vocab, seed):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, vocab, n)] for n in PROMPT_LENS]


def evaluate(args, name, ref, gguf, all_ids, rows):
    for dev, ids, one in ((d, i, o) for d in args.strata_devices.split(",") for i in all_ids
                         for o in (False, True)):
        args.strata_device = dev
        got_ids, greedy, blocks = strata_logits(args, gguf, ids, args.greedy, one_by_one=one)
        if got_ids != ids:
            raise SetupError(f"strata logits echoed other ids: {got_ids[:8]} vs {ids[:8]}")
        ref_blocks = ref.last_logits(ids + greedy, args.greedy + 1)
        c = compare_case(blocks, greedy, ref_blocks, ref.greedy(ids, args.greedy))
        ok = c["err_max"] <= F32_TOL and (c["agree"] == c["n"] or c["tie"])
        rows.append(dict(backend=dev, config=name, prompt=len(ids), one_by_one=one, ok=ok,
                         **c))
        log(f"  {name} {dev} prompt {len(ids):3d}{' one-by-one' if one else '           '}: "
            f"max rel err {c['err_max']:.2e} (first block {c['err0']:.2e}), greedy "
            f"{c['agree']}/{c['n']}{' (near-tie)' if c['agree'] < c['n'] and c['tie'] else ''}"
            f" {'ok' if ok else 'FAIL'}")


def ci_reference(args, rows):
    out = os.path.join(args.out, "ci-ref-gptoss")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ref, gguf, vocab = build(args, "ci", CI_CONFIG, args.ci_init_std, out)
    all_ids = prompts(vocab, args.seed + 1)[:3]
    blocks, cases = [], []
    for i, ids in enumerate(all_ids):
        greedy = ref.greedy(ids, args.greedy)
        blocks.append(ref.last_logits(ids + greedy, args.greedy + 1).astype(np.float32))
        cases.append(dict(text=None, ids=ids, greedy=greedy, block0=i * (args.greedy + 1)))
    np.concatenate(blocks).astype("<f4").tofile(os.path.join(out, "logits.bin"))
    meta = dict(model="model.gguf", hf_dir="hf", logits="logits.bin", n_vocab=vocab,
                n_greedy=args.greedy, tolerance=F32_TOL, seed=args.seed,
                init_std=args.ci_init_std, config=CI_CONFIG, reference=ref.versions,
                note="logits.bin: for each case, 1 + n_greedy blocks of n_vocab float32: the "
                     "reference's logits after the prompt and after each of its greedy tokens "
                     "(teacher-forced on those tokens); block0 is the case's first block.",
                cases=cases)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(meta, f, indent=1)
    evaluate(args, "ci", ref, gguf, all_ids, rows)
    log(f"  ci-ref-gptoss: {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True, help="path of the strata binary")
    ap.add_argument("--out", required=True, help="summary.md and ci-ref-gptoss/ go here")
    ap.add_argument("--work", help="checkpoints and GGUF files (default: a temp dir, removed)")
    ap.add_argument("--configs", default="A,B",
                    help="comma-separated; empty: the CI reference only")
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--init-std", type=float, default=0.08)
    ap.add_argument("--ci-init-std", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", help="torch device of the reference")
    ap.add_argument("--no-ci-ref", action="store_true")
    ap.add_argument("--strata-devices", default="cpu",
                    help="strata backends to check, comma-separated (cpu,cuda)")
    args = ap.parse_args()
    args.strata_device = "cpu"  # set per backend by evaluate
    args.self_test = False
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    tmp = None
    if not args.work:
        tmp = args.work = tempfile.mkdtemp(prefix="strata-hf-gptoss-")
    rows, versions = [], None
    try:
        import torch
        torch.set_num_threads(args.threads)
        for name in filter(None, args.configs.split(",")):
            d = os.path.join(args.work, name)
            ref, gguf, vocab = build(args, name, CONFIGS[name], args.init_std, d)
            versions = ref.versions
            evaluate(args, name, ref, gguf, prompts(vocab, args.seed), rows)
        if not args.no_ci_ref:
            ci_reference(args, rows)
    except SetupError as e:
        print(f"compare_gptoss: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"# strata vs transformers, gpt-oss ({versions}), {time.time() - t0:.0f} s", "",
             "| backend | config | prompt | feed | max rel err | greedy | ok |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        feed = "one by one" if r["one_by_one"] else "batch"
        lines.append(f"| {r['backend']} | {r['config']} | {r['prompt']} | {feed}"
                     f" | {r['err_max']:.2e} | {r['agree']}/{r['n']}{' tie' if r['tie'] else ''}"
                     f" | {'yes' if r['ok'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary-gptoss.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""compare_qwen3next: strata against Hugging Face transformers on random-weight qwen3next
(Qwen3NextForCausalLM) and qwen35moe (Qwen3_5MoeForCausalLM) checkpoints: the whole-model check
of DESIGN.md §8 for the hybrid Gated DeltaNet architectures. Method: docs/hf-reference.md.

For each architecture, two configurations (A: hidden 256, 4 layers with full attention every
2nd, 4/2 heads of 64 rotating 16 dims, linear attention 2 q/k heads and 4 v heads of 32, 16
experts top-4, expert and shared ffn 128; B: hidden 192, 6 layers, interval 3, 6/2 heads of 32
rotating 8, linear 2/6 heads of 16, 8 experts top-2, ffn 96 / shared 64), it

  1. builds the random-init model in float32 (eager attention): matrices N(0, std^2), the
     (1 + w) norms' w N(0, 0.1^2), the gated norm's weight 1 + N(0, 0.1^2), A_log and
     dt_bias as transformers initialises them; saves it with save_pretrained next to a tiny
     tokenizer;
  2. runs `strata convert --quant f32` and `strata logits --greedy N` on prompts of random ids
     of 1, 7, 40 and 90 tokens (past the conv window and transformers' 64-token chunk of the
     delta rule), batched and one token at a time (strata runs these models on the CPU so far);
  3. compares, block by block, with transformers' logits teacher-forced on strata's tokens, and
     strata's greedy tokens with transformers' own argmax loop: max |strata - hf| / max |hf|
     <= 1e-3 in every block and the same greedy tokens (a divergence at a near-tie is reported,
     not failed);
  4. writes a small reference per architecture for CI (OUT/ci-ref-<arch>/, the format of
     tests/data/hf-ref/).

Exit 0 when the criteria hold, 1 when they fail, 2 on a setup error. Needs numpy, torch and
transformers with Qwen3Next and Qwen3.5-MoE (5.x).
"""

import argparse
import json
import os
import shutil
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
    "A": dict(hidden_size=256, num_hidden_layers=4, full_attention_interval=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
              num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
              shared_expert_intermediate_size=128),
    "B": dict(hidden_size=192, num_hidden_layers=6, full_attention_interval=3,
              num_attention_heads=6, num_key_value_heads=2, head_dim=32,
              partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=6,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96,
              shared_expert_intermediate_size=64),
}
CI_CONFIG = dict(hidden_size=64, num_hidden_layers=2, full_attention_interval=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 partial_rotary_factor=0.5, linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=32)
PROMPT_LENS = [1, 7, 40, 90]
ARCHES = ("qwen3next", "qwen35moe")


def classes(arch):
    """(config class, model class) of transformers for arch."""
    import transformers
    names = {"qwen3next": [("Qwen3NextConfig", "Qwen3NextForCausalLM")],
             "qwen35moe": [("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
                           ("Qwen3_5MoeConfig", "Qwen3_5MoeForCausalLM")]}[arch]
    for c, m in names:
        if hasattr(transformers, c) and hasattr(transformers, m):
            return getattr(transformers, c), getattr(transformers, m)
    raise SetupError(f"transformers {transformers.__version__} has none of {names}")


class HF(compare_qwen3moe.HF):
    """A random-init hybrid model in float32 with eager attention (last_logits and greedy as
    for Qwen3-MoE: full forwards without a cache)."""

    def __init__(self, args, arch, cfg, vocab, std):
        import torch
        import transformers
        self.torch = torch
        self.dev = torch.device(args.device)
        if self.dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        conf_cls, model_cls = classes(arch)
        n_layer, every = cfg["num_hidden_layers"], cfg["full_attention_interval"]
        kw = dict(cfg)
        kw.update(vocab_size=vocab, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  initializer_range=std, max_position_embeddings=4096,
                  layer_types=["full_attention" if (i + 1) % every == 0 else "linear_attention"
                               for i in range(n_layer)],
                  decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                  intermediate_size=cfg["moe_intermediate_size"],
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
        rope = dict(rope_type="default", rope_theta=1e6,
                    partial_rotary_factor=cfg["partial_rotary_factor"])
        if arch == "qwen35moe":
            half = int(cfg["head_dim"] * cfg["partial_rotary_factor"]) // 2
            rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
            rope["mrope_interleaved"] = True
        try:  # transformers 5.x
            conf = conf_cls(**kw, rope_parameters=rope)
        except TypeError:
            conf = conf_cls(**kw, rope_theta=1e6)
        self.model = compare_qwen3moe.eager_model(model_cls, conf, args.seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name.endswith(("A_log", "dt_bias")):
                    continue  # transformers' own init: log U(0, 16) and ones
                if name.endswith("linear_attn.norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))  # plain multiplicative
                elif p.dim() >= 2:
                    p.normal_(0.0, std)
                else:
                    p.copy_(0.1 * torch.randn_like(p))  # (1 + w) norms
        self.model.eval().to(self.dev)
        impl = getattr(self.model.config, "_attn_implementation", "?")
        if impl != "eager":
            raise SetupError(f"attention implementation is {impl}, expected eager")
        self.versions = (f"torch {torch.__version__}, transformers {transformers.__version__}"
                         f" (float32, attention {impl})")

    def save(self, path):
        self.model.save_pretrained(path)


def build(args, arch, name, cfg, std, out_dir):
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    tok_json, tok_cfg, n_tok = tiny_tokenizer()
    vocab = (n_tok + 7) // 8 * 8
    ref = HF(args, arch, cfg, vocab, std)
    ref.save(hf_dir)
    write_tokenizer_files(hf_dir, tok_json, tok_cfg)
    gguf = os.path.join(out_dir, "model.gguf")
    run([args.strata, "convert", hf_dir, "-o", gguf, "--quant", "f32", "--name",
         f"{arch}-{name}", "-q"], f"strata convert ({arch} {name})")
    return ref, gguf, vocab


def prompts(vocab, seed):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, vocab, n)] for n in PROMPT_LENS]


def evaluate(args, arch, name, ref, gguf, all_ids, rows):
    for dev, ids, one in ((d, i, o) for d in args.strata_devices.split(",") for i in all_ids
                         for o in (False, True)):
        args.strata_device = dev
        got_ids, greedy, blocks = strata_logits(args, gguf, ids, args.greedy, one_by_one=one)
        if got_ids != ids:
            raise SetupError(f"strata logits echoed other ids: {got_ids[:8]} vs {ids[:8]}")
        ref_blocks = ref.last_logits(ids + greedy, args.greedy + 1)
        c = compare_case(blocks, greedy, ref_blocks, ref.greedy(ids, args.greedy))
        ok = c["err_max"] <= F32_TOL and (c["agree"] == c["n"] or c["tie"])
        rows.append(dict(backend=dev, arch=arch, config=name, prompt=len(ids), one_by_one=one,
                         ok=ok, **c))
        log(f"  {arch} {name} {dev} prompt {len(ids):3d}"
            f"{' one-by-one' if one else '           '}:"
            f" max rel err {c['err_max']:.2e} (first block {c['err0']:.2e}), greedy "
            f"{c['agree']}/{c['n']}{' (near-tie)' if c['agree'] < c['n'] and c['tie'] else ''}"
            f" {'ok' if ok else 'FAIL'}")


def ci_reference(args, arch, rows):
    out = os.path.join(args.out, f"ci-ref-{arch}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    ref, gguf, vocab = build(args, arch, "ci", CI_CONFIG, args.ci_init_std, out)
    all_ids = prompts(vocab, args.seed + 1)[:3]
    blocks, cases = [], []
    for i, ids in enumerate(all_ids):
        greedy = ref.greedy(ids, args.greedy)
        blocks.append(ref.last_logits(ids + greedy, args.greedy + 1).astype(np.float32))
        cases.append(dict(text=None, ids=ids, greedy=greedy, block0=i * (args.greedy + 1)))
    np.concatenate(blocks).astype("<f4").tofile(os.path.join(out, "logits.bin"))
    meta = dict(model="model.gguf", hf_dir="hf", logits="logits.bin", n_vocab=vocab,
                n_greedy=args.greedy, tolerance=F32_TOL, seed=args.seed,
                init_std=args.ci_init_std, config=CI_CONFIG, reference=ref.versions, arch=arch,
                note="logits.bin: for each case, 1 + n_greedy blocks of n_vocab float32: the "
                     "reference's logits after the prompt and after each of its greedy tokens "
                     "(teacher-forced on those tokens); block0 is the case's first block.",
                cases=cases)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(meta, f, indent=1)
    evaluate(args, arch, "ci", ref, gguf, all_ids, rows)
    log(f"  ci-ref-{arch}: {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True, help="path of the strata binary")
    ap.add_argument("--out", required=True, help="summary and ci-ref-<arch>/ go here")
    ap.add_argument("--work", help="checkpoints and GGUF files (default: a temp dir, removed)")
    ap.add_argument("--arches", default=",".join(ARCHES))
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
        tmp = args.work = tempfile.mkdtemp(prefix="strata-hf-qwen3next-")
    rows, versions = [], None
    try:
        import torch
        torch.set_num_threads(args.threads)
        for arch in args.arches.split(","):
            for name in filter(None, args.configs.split(",")):
                d = os.path.join(args.work, arch, name)
                ref, gguf, vocab = build(args, arch, name, CONFIGS[name], args.init_std, d)
                versions = ref.versions
                evaluate(args, arch, name, ref, gguf, prompts(vocab, args.seed), rows)
            if not args.no_ci_ref:
                ci_reference(args, arch, rows)
    except SetupError as e:
        print(f"compare_qwen3next: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"# strata vs transformers, qwen3next / qwen35moe ({versions}), "
             f"{time.time() - t0:.0f} s", "",
             "| backend | arch | config | prompt | feed | max rel err | greedy | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        feed = "one by one" if r["one_by_one"] else "batch"
        lines.append(f"| {r['backend']} | {r['arch']} | {r['config']} | {r['prompt']} | {feed}"
                     f" | {r['err_max']:.2e} | {r['agree']}/{r['n']}{' tie' if r['tie'] else ''}"
                     f" | {'yes' if r['ok'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary-qwen3next.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

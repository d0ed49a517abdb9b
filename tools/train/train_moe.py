#!/usr/bin/env python3
"""Train strata's small default MoE model (issue 7) on the GPU machine, offline.

Qwen3-30B-A3B's routing geometry (128 experts, top-8, renormalised softmax router, the
load-balancing loss Qwen3 trains with) at a small hidden size and expert FFN, 16 layers, on the
Python sources of the installed packages, with a byte-level BPE tokenizer trained here on the
same corpus (Qwen2 pre-tokenizer regex, so strata's tokenizer reads it). Saves a Hugging Face
checkpoint (safetensors + config.json + tokenizer.json + tokenizer_config.json) for
`strata convert`, plus the loss curve and the held-out loss as JSON.

Status: written for the GPU machine (torch, transformers 5.x, tokenizers); not yet run.

    python3 tools/train/train_moe.py --out OUT --minutes 15
    build/strata convert OUT/hf -o models/strata-default.gguf --quant q4_k_m
"""
import argparse
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def corpus_files(max_bytes):
    """Python sources of the installed packages, in a stable order, up to max_bytes."""
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    files = []
    for root in sorted(roots):
        for d, _, names in os.walk(root):
            for n in sorted(names):
                if n.endswith(".py"):
                    files.append(os.path.join(d, n))
    files.sort(key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    out, total = [], 0
    for p in files:
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        out.append((p, text))
        total += len(text)
        if total >= max_bytes:
            break
    return out


def split_heldout(files, frac):
    """Files whose path hash falls below frac go to the held-out set."""
    train, held = [], []
    for p, t in files:
        h = int(hashlib.sha1(p.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (held if h < frac else train).append(t)
    return train, held


def train_tokenizer(texts, vocab_size, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
                   "model_max_length": 1024}, f, indent=1)
    return tok


def encode_all(tok, texts, eot):
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=15.0, help="training wall-clock budget")
    ap.add_argument("--corpus-mb", type=float, default=200.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--expert-ffn", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=20261130)
    a = ap.parse_args()

    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    hf_dir = os.path.join(a.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    t0 = time.time()
    files = corpus_files(int(a.corpus_mb * 1e6))
    train_texts, held_texts = split_heldout(files, 0.02)
    print(f"corpus: {len(files)} files, {sum(len(t) for _, t in files) / 1e6:.1f} MB "
          f"({len(held_texts)} held out), {time.time() - t0:.1f} s", flush=True)
    tok = train_tokenizer(train_texts, a.vocab, hf_dir)
    eot = tok.token_to_id("<|endoftext|>")
    train_ids = torch.tensor(encode_all(tok, train_texts, eot), dtype=torch.long)
    held_ids = torch.tensor(encode_all(tok, held_texts, eot), dtype=torch.long)
    print(f"tokens: {train_ids.numel() / 1e6:.1f} M train, {held_ids.numel() / 1e6:.2f} M held "
          f"out; vocab {tok.get_vocab_size()}", flush=True)

    cfg = Qwen3MoeConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        intermediate_size=4 * a.hidden, moe_intermediate_size=a.expert_ffn, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        output_router_logits=True, router_aux_loss_coef=0.001,
        max_position_embeddings=1024, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=eot)
    dev = "cuda"
    model = Qwen3MoeForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.1f} M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def batch(ids, n):
        ix = torch.randint(0, ids.numel() - a.seq - 1, (n,))
        x = torch.stack([ids[i:i + a.seq] for i in ix])
        return x.to(dev)

    @torch.no_grad()
    def held_loss(n_batches=20):
        model.eval()
        tot = 0.0
        g = torch.Generator().manual_seed(0)
        for _ in range(n_batches):
            ix = torch.randint(0, held_ids.numel() - a.seq - 1, (a.batch,), generator=g)
            x = torch.stack([held_ids[i:i + a.seq] for i in ix]).to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                tot += model(input_ids=x, labels=x).loss.item()
        model.train()
        return tot / n_batches

    budget = a.minutes * 60.0
    curve, step, start = [], 0, time.time()
    model.train()
    while time.time() - start < budget:
        frac = (time.time() - start) / budget
        lr = a.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train_ids, a.batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0:
            aux = float(out.aux_loss) if getattr(out, "aux_loss", None) is not None else float("nan")
            curve.append({"step": step, "seconds": round(time.time() - start, 1),
                          "loss": round(out.loss.item(), 4), "aux_loss": round(aux, 4),
                          "lr": lr})
            print(json.dumps(curve[-1]), flush=True)
        step += 1
    final = held_loss()
    print(f"held-out loss {final:.4f} after {step} steps, {(time.time() - start) / 60:.1f} min",
          flush=True)
    model.save_pretrained(hf_dir, safe_serialization=True)
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump({"args": vars(a), "params": n_params, "steps": step,
                   "train_tokens": int(train_ids.numel()), "held_out_loss": final,
                   "curve": curve, "torch": torch.__version__}, f, indent=1)
    model.eval()
    prompt = "def fibonacci(n):\n"
    ids = torch.tensor([tok.encode(prompt).ids], device=dev)
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=48, do_sample=False)
    print("sample:", json.dumps(tok.decode(gen[0].tolist())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

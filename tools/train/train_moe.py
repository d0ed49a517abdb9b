#!/usr/bin/env python3
"""Train strata's small default MoE model on a GPU machine, offline.

Qwen3-30B-A3B's routing geometry (128 experts, top-8, softmax router renormalised over the
top-k, the load-balancing loss Qwen3 trains with, coefficient 0.001) at a small hidden size and
expert FFN, on the Python sources installed on the machine, with a byte-level BPE tokenizer
trained here on the same corpus (Qwen2 pre-tokenizer regex, so strata's tokenizer reads it).

The model is a plain PyTorch re-statement of transformers' Qwen3MoeForCausalLM. Its MoE block
computes every expert densely and weights the ones not chosen by exactly zero: with 128
experts of FFN length 32 that is one (tokens x 256) @ (256 x 8192) matmul per layer, which
is far faster than a loop over experts, and it gives the same function and the same gradients
(an unchosen expert's output is multiplied by 0, so it gets no gradient from that token).

Outputs, under --out:
  hf/            safetensors (per-expert tensor names, as on the Hub) + config.json +
                 tokenizer.json + tokenizer_config.json, for `strata convert`
  training.json  arguments, loss curve (train and held-out), final held-out loss, timings
  check.json     the exported checkpoint loaded back by transformers: max |logit difference|
                 against this script's model on held-out text (float32)
  heldout.txt    a few held-out files, for `strata stats-routing --prompts`

    python3 tools/train/train_moe.py --out OUT --minutes 5.5
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


def log(msg):
    print(msg, flush=True)


def corpus_files(max_bytes):
    """Python sources of the installed packages and the standard library, in a stable order
    (by path hash, so no package dominates a prefix), up to max_bytes."""
    p = sysconfig.get_paths()
    roots = sorted({p["purelib"], p["platlib"], p["stdlib"]})
    files = []
    for root in roots:
        for d, _, names in os.walk(root):
            files.extend(os.path.join(d, n) for n in names if n.endswith(".py"))
    files = sorted(set(files), key=lambda q: hashlib.sha1(q.encode()).hexdigest())
    out, total = [], 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > 400_000:
            continue
        out.append((path, text))
        total += len(text)
        if total >= max_bytes:
            break
    return out


def split_heldout(files, frac):
    """Files whose path hash falls below frac go to the held-out set."""
    train, held = [], []
    for path, text in files:
        # a hash independent of the corpus order (which sorts by sha1 of the path)
        h = int(hashlib.sha1(b"held-out:" + path.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (held if h < frac else train).append(text)
    if not held and len(train) > 1:
        held.append(train.pop())
    if not train or not held:
        raise SystemExit(f"held-out split left {len(train)} training and {len(held)} held-out files")
    return train, held


def train_tokenizer(texts, vocab_size, out_dir):
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            trainers)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # as Qwen's tokenizer.json, which strata's 'qwen2' expects
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
                   "model_max_length": 1024}, f, indent=1)
    return tok


def encode_all(tok, texts, eot):
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return ids


GGML_BLOCKS = {"q4_k": (256, 144), "q6_k": (256, 210), "q8_0": (32, 34), "f32": (1, 4)}


def tensor_bytes(ne0, n, kind):
    """Bytes of an n-element tensor with rows of ne0 in the q4_k_m mix's type for it, with the
    same fallbacks as strata's core/quant_mix.c (a row length the block does not divide takes
    Q8_0, or F32 when 32 does not divide it either)."""
    if kind in ("q4_k", "q6_k") and ne0 % 256:
        kind = "q8_0" if ne0 % 32 == 0 else "f32"
    if kind == "q8_0" and ne0 % 32:
        kind = "f32"
    block, size = GGML_BLOCKS[kind]
    return n // block * size


def q4_k_m_bytes(layers, hidden, ffn, vocab, experts=128, heads=4, kv_heads=2, head_dim=64):
    """The tensor bytes of the q4_k_m file for a shape (metadata and tokenizer not counted):
    experts gate/up Q4_K, down Q6_K, attention Q8_0, token embedding Q4_K, output Q6_K, norms and
    router F32."""
    h, q, kv = hidden, heads * head_dim, kv_heads * head_dim
    per = (tensor_bytes(h, h * q, "q8_0") + 2 * tensor_bytes(h, h * kv, "q8_0") +
           tensor_bytes(q, q * h, "q8_0") + 4 * (2 * head_dim + 2 * h + experts * h) +
           2 * tensor_bytes(h, h * ffn * experts, "q4_k") +
           tensor_bytes(ffn, ffn * h * experts, "q6_k"))
    return (layers * per + tensor_bytes(h, vocab * h, "q4_k") + tensor_bytes(h, vocab * h, "q6_k")
            + 4 * h)


def parse_shape(text):
    """'LAYERSxHIDDENxFFN' -> (layers, hidden, ffn)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"shape '{text}': expected LAYERSxHIDDENxFFN, e.g. 16x256x32")
    return tuple(int(p) for p in parts)


def build_model(cfg):
    import torch
    import torch.nn.functional as F
    from torch import nn

    H, E, FF, K = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"], \
        cfg["num_experts_per_tok"]
    NH, NKV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * y.to(x.dtype)

    def rotate_half(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(H, NH * D, bias=False)
            self.k_proj = nn.Linear(H, NKV * D, bias=False)
            self.v_proj = nn.Linear(H, NKV * D, bias=False)
            self.o_proj = nn.Linear(NH * D, H, bias=False)
            self.q_norm = RMSNorm(D)
            self.k_norm = RMSNorm(D)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q = self.q_norm(self.q_proj(x).view(B, T, NH, D)).transpose(1, 2)
            k = self.k_norm(self.k_proj(x).view(B, T, NKV, D)).transpose(1, 2)
            v = self.v_proj(x).view(B, T, NKV, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, NH * D))

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(H, E, bias=False)
            # [gate|up][expert][row][hidden] and down stored transposed ([expert][row][hidden])
            self.gate_up = nn.Parameter(torch.empty(2, E, FF, H))
            self.down_t = nn.Parameter(torch.empty(E, FF, H))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, H)
            logits = self.gate(x)
            probs = torch.softmax(logits.float(), dim=-1)
            top_w, top_i = probs.topk(K, dim=-1)
            top_w = top_w / top_w.sum(-1, keepdim=True)
            dense_w = torch.zeros_like(probs).scatter(1, top_i, top_w)
            gu = F.linear(x, self.gate_up.view(2 * E * FF, H))
            g, u = gu.split(E * FF, dim=-1)
            a = (F.silu(g) * u).view(-1, E, FF) * dense_w.to(gu.dtype).unsqueeze(-1)
            y = a.view(-1, E * FF) @ self.down_t.view(E * FF, H).to(a.dtype)
            return y.view(shape), logits

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(H)
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm(H)
            self.mlp = MoE()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            y, logits = self.mlp(self.post_attention_layernorm(x))
            return x + y, logits

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], H)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["num_hidden_layers"]))
            self.norm = RMSNorm(H)
            self.lm_head = nn.Linear(H, cfg["vocab_size"], bias=False)
            inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            self.register_buffer("inv_freq", inv, persistent=False)
            std = cfg["initializer_range"]
            for n, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, std=std)

        def forward(self, ids):
            T = ids.shape[1]
            pos = torch.arange(T, device=ids.device, dtype=torch.float32)
            f = torch.outer(pos, self.inv_freq)
            emb = torch.cat((f, f), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            x = self.embed_tokens(ids)
            router = []
            for layer in self.layers:
                x, r = layer(x, cos.to(x.dtype), sin.to(x.dtype))
                router.append(r)
            return self.lm_head(self.norm(x)), router

    def aux_loss(router):
        """transformers' load_balancing_loss_func: all layers' router logits together."""
        g = torch.cat(router, dim=0).float()
        p = torch.softmax(g, dim=-1)
        sel = p.topk(K, dim=-1).indices            # [N, K]
        # the mean over tokens of one_hot(sel) ([K, E]), without the [N, K, E] tensor
        tokens_per_expert = torch.zeros(K, E, device=g.device).scatter_add_(
            1, sel.t(), torch.ones(K, sel.shape[0], device=g.device)) / sel.shape[0]
        prob_per_expert = p.mean(0)                # [E]
        return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E

    return Model(), aux_loss


def hf_state_dict(model, cfg):
    """The model's tensors under the Hub's Qwen3-MoE names (per-expert), float32, contiguous."""
    out = {}
    E = cfg["num_experts"]
    for n, p in model.state_dict().items():
        t = p.detach().float().cpu()
        if n.endswith("mlp.gate_up"):
            base = n[: -len("gate_up")]
            for e in range(E):
                out[f"model.{base}experts.{e}.gate_proj.weight"] = t[0, e].contiguous()
                out[f"model.{base}experts.{e}.up_proj.weight"] = t[1, e].contiguous()
        elif n.endswith("mlp.down_t"):
            base = n[: -len("down_t")]
            for e in range(E):
                out[f"model.{base}experts.{e}.down_proj.weight"] = t[e].t().contiguous()
        elif n.startswith("lm_head"):
            out[n] = t.contiguous()
        else:
            out["model." + n] = t.contiguous()
    return out


def strata_check(a, model, held_ids, out_dir):
    """Convert the export with strata (f32 and --quant), then compare strata's CPU logits on a
    held-out prompt and 16 greedy tokens with this script's model (float32, teacher-forced on
    strata's tokens). Returns a dict for check.json."""
    import subprocess

    import numpy as np
    import torch
    res = {}
    prompt = held_ids[:64].tolist()
    for quant in ("f32", a.quant):
        gguf = os.path.join(out_dir, f"model-{quant}.gguf")
        t = time.time()
        subprocess.run([a.strata, "convert", os.path.join(out_dir, "hf"), "-o", gguf,
                        "--quant", quant], check=True)
        conv_s = time.time() - t
        lg = os.path.join(out_dir, f"logits-{quant}.bin")
        r = subprocess.run([a.strata, "logits", "-m", gguf, "--ids", ",".join(map(str, prompt)),
                            "--greedy", "16", "-o", lg], check=True, capture_output=True,
                           text=True)
        greedy = [int(v) for v in r.stdout.split("greedy:")[1].split()]
        theirs = np.fromfile(lg, dtype=np.float32).reshape(17, -1)
        x = torch.tensor([prompt + greedy], device="cuda")
        with torch.no_grad():
            mine = model(x)[0][0, len(prompt) - 1:].float().cpu().numpy()
        rel = float(np.abs(mine - theirs).max() / np.abs(mine).max())
        agree = float((mine.argmax(-1) == theirs.argmax(-1)).mean())
        res[quant] = {"bytes": os.path.getsize(gguf), "convert_s": round(conv_s, 1),
                      "max_rel_err": rel, "argmax_agree": agree, "greedy": greedy}
        log(f"strata {quant}: {os.path.getsize(gguf) / 1e6:.1f} MB, max rel err {rel:.2e}, "
            f"argmax agrees on {agree * 17:.0f}/17")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.5, help="training wall-clock budget")
    ap.add_argument("--corpus-mb", type=float, default=160.0)
    ap.add_argument("--tokenizer-mb", type=float, default=30.0,
                    help="corpus share the BPE merges are learned from")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--expert-ffn", type=int, default=32)
    ap.add_argument("--trials", default="",
                    help="comma-separated shapes LAYERSxHIDDENxFFN (e.g. 16x256x32,9x256x64) "
                         "trained --trial-minutes each; the one with the lowest held-out loss "
                         "is then trained for --minutes (instead of --layers/--hidden/--expert-ffn)")
    ap.add_argument("--trial-minutes", type=float, default=1.0)
    ap.add_argument("--cap-mb", type=float, default=48.0,
                    help="the --quant q4_k_m file's size cap: trial shapes over it are refused")
    ap.add_argument("--ref-corpus-mb", type=float, default=0.0,
                    help="also report the held-out loss on the held-out files of the first this "
                         "many MB of the corpus (the corpus an earlier model was trained on, so "
                         "its held-out loss compares)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--strata", help="strata binary: convert the export and check its logits")
    ap.add_argument("--quant", default="q4_k_m", help="the shipped mix (with --strata)")
    ap.add_argument("--repetition-penalty", type=float,
                    help="written to hf/generation_config.json, which strata convert stores as "
                         "the model's general.sampling.penalty_repeat (the default strata run "
                         "then uses); measure it with bench/sampling_loops.py")
    a = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 checks below compare to 1e-5
    hf_dir = os.path.join(a.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    if a.repetition_penalty:
        with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
            json.dump({"do_sample": True, "repetition_penalty": a.repetition_penalty}, f, indent=1)
    t0 = time.time()
    files = corpus_files(int(a.corpus_mb * 1e6))
    train_texts, held_texts = split_heldout(files, 0.02)
    log(f"corpus: {len(files)} files, {sum(len(t) for _, t in files) / 1e6:.1f} MB "
        f"({len(held_texts)} held out), {time.time() - t0:.1f} s")
    tok_texts, n = [], 0
    for t in train_texts:
        if n >= a.tokenizer_mb * 1e6:
            break
        tok_texts.append(t)
        n += len(t)
    tok = train_tokenizer(tok_texts, a.vocab, hf_dir)
    eot = tok.token_to_id("<|endoftext|>")
    log(f"tokenizer: vocab {tok.get_vocab_size()} from {n / 1e6:.1f} MB, {time.time() - t0:.1f} s")
    dev = "cuda"
    train_ids = torch.tensor(encode_all(tok, train_texts, eot), dtype=torch.long, device=dev)
    held_ids = torch.tensor(encode_all(tok, held_texts, eot), dtype=torch.long, device=dev)
    n_bytes = sum(len(t.encode()) for t in train_texts)
    log(f"tokens: {train_ids.numel() / 1e6:.1f} M train ({n_bytes / train_ids.numel():.2f} "
        f"bytes/token), {held_ids.numel() / 1e6:.2f} M held out, {time.time() - t0:.1f} s")
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write("\n".join(t for t in held_texts[:40] if len(t) < 20000))
    ref_ids = None
    if a.ref_corpus_mb:
        k, total = 0, 0
        while k < len(files) and total < a.ref_corpus_mb * 1e6:
            total += len(files[k][1])
            k += 1
        ref_held = split_heldout(files[:k], 0.02)[1]
        ref_ids = torch.tensor(encode_all(tok, ref_held, eot), dtype=torch.long, device=dev)
        log(f"reference held-out set: {len(ref_held)} files of the first {k}, "
            f"{ref_ids.numel() / 1e6:.2f} M tokens")

    def make_cfg(layers, hidden, ffn):
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "vocab_size": tok.get_vocab_size(), "hidden_size": hidden,
            "intermediate_size": 4 * hidden, "moe_intermediate_size": ffn,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
            "output_router_logits": False, "max_position_embeddings": 1024, "rope_theta": 1e6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": None,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "initializer_range": 0.02,
            "bos_token_id": None, "eos_token_id": eot, "pad_token_id": eot, "use_cache": True,
            "torch_dtype": "float32", "dtype": "float32",
        }

    def batch(ids, n, gen=None):
        ix = torch.randint(0, ids.numel() - a.seq - 1, (n,), device=dev, generator=gen)
        return ids[ix[:, None] + torch.arange(a.seq + 1, device=dev)[None, :]]

    def train(cfg, minutes, tag):
        """A fresh model of cfg's shape (same seed) trained for minutes of wall clock with the
        warm-up and cosine schedule over that budget. Returns (model, result dict)."""
        torch.manual_seed(a.seed)
        model, aux_loss = build_model(cfg)
        model = model.to(dev)
        n_params = sum(p.numel() for p in model.parameters())
        log(f"{tag}: {cfg['num_hidden_layers']} layers x hidden {cfg['hidden_size']} x expert "
            f"FFN {cfg['moe_intermediate_size']}, {n_params / 1e6:.1f} M parameters, "
            f"{minutes:g} min")
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                weight_decay=0.1, fused=True)

        def lm_loss(x):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, router = model(x[:, :-1])
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                 x[:, 1:].reshape(-1))
            return ce, aux_loss(router)

        @torch.no_grad()
        def held_loss(ids, n_batches=16):
            model.eval()
            g = torch.Generator(device=dev).manual_seed(0)
            tot = sum(lm_loss(batch(ids, a.batch, g))[0].item() for _ in range(n_batches))
            model.train()
            return tot / n_batches

        budget = minutes * 60.0
        curve, step, start, warm = [], 0, time.time(), 100
        model.train()
        while time.time() - start < budget:
            frac = (time.time() - start) / budget
            lr = a.lr * min(1.0, (step + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr
            ce, aux = lm_loss(batch(train_ids, a.batch))
            (ce + cfg["router_aux_loss_coef"] * aux).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 100 == 0:
                row = {"step": step, "seconds": round(time.time() - start, 1),
                       "loss": round(ce.item(), 4), "aux_loss": round(aux.item(), 4),
                       "lr": round(lr, 6)}
                if step % 500 == 0:
                    row["held_out_loss"] = round(held_loss(held_ids, 4), 4)
                curve.append(row)
                log(f"{tag} " + json.dumps(row))
            step += 1
        train_s = time.time() - start
        res = {"layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
               "expert_ffn": cfg["moe_intermediate_size"], "params": n_params, "steps": step,
               "tokens_seen": step * a.batch * a.seq, "train_seconds": round(train_s, 1),
               "held_out_loss": held_loss(held_ids), "curve": curve}
        if ref_ids is not None:
            res["held_out_loss_ref"] = held_loss(ref_ids)
        del opt
        log(f"{tag}: held-out loss {res['held_out_loss']:.4f} (ppl "
            f"{math.exp(res['held_out_loss']):.2f})"
            + (f", on the {a.ref_corpus_mb:g} MB corpus's held-out files "
               f"{res['held_out_loss_ref']:.4f}" if ref_ids is not None else "")
            + f" after {step} steps, {res['tokens_seen'] / 1e6:.0f} M tokens, "
            f"{train_s / 60:.1f} min ({res['tokens_seen'] / train_s / 1e3:.0f} k tokens/s)")
        return model, res

    cap = a.cap_mb * 1e6 - 0.4e6  # the tokenizer and metadata take about 0.3 MB
    shapes = [parse_shape(t) for t in a.trials.split(",")] if a.trials else []
    for sh in shapes:
        est = q4_k_m_bytes(*sh, tok.get_vocab_size())
        log(f"shape {sh[0]}x{sh[1]}x{sh[2]}: about {est / 1e6:.1f} MB of tensors at q4_k_m")
        if est > cap:
            raise SystemExit(f"shape {sh[0]}x{sh[1]}x{sh[2]} does not fit {a.cap_mb:g} MB")
    trials = []
    for i, sh in enumerate(shapes):
        _, res = train(make_cfg(*sh), a.trial_minutes, f"trial {i + 1}/{len(shapes)}")
        res["q4_k_m_tensor_bytes"] = q4_k_m_bytes(*sh, tok.get_vocab_size())
        trials.append(res)
        torch.cuda.empty_cache()
    shape = (a.layers, a.hidden, a.expert_ffn)
    if trials:
        best = min(trials, key=lambda r: r["held_out_loss"])
        shape = (best["layers"], best["hidden"], best["expert_ffn"])
        log(f"trials: {shape[0]}x{shape[1]}x{shape[2]} has the lowest held-out loss")
    cfg = make_cfg(*shape)
    model, res = train(cfg, a.minutes, "run")
    step, curve, train_s = res["steps"], res["curve"], res["train_seconds"]
    final, tokens_seen, n_params = res["held_out_loss"], res["tokens_seen"], res["params"]

    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(hf_state_dict(model, cfg), os.path.join(hf_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump({"args": vars(a), "params": n_params, "steps": step,
                   "tokens_seen": tokens_seen, "train_seconds": round(train_s, 1),
                   "train_tokens": int(train_ids.numel()), "held_out_tokens": int(held_ids.numel()),
                   "corpus_files": len(files), "corpus_bytes": sum(len(t) for _, t in files),
                   "held_out_loss": final, "held_out_loss_ref": res.get("held_out_loss_ref"),
                   "layers": shape[0], "hidden": shape[1], "expert_ffn": shape[2],
                   "trials": trials, "curve": curve, "torch": torch.__version__}, f, indent=1)

    # The export checked by transformers itself: the same function, float32, no autocast.
    check = {}
    try:
        import transformers
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(dev).eval()
        model.eval()
        x = batch(held_ids, 4, torch.Generator(device=dev).manual_seed(1))[:, :128]
        with torch.no_grad():
            mine = model(x)[0].float()
            theirs = hf(input_ids=x).logits.float()
        diff = (mine - theirs).abs().max().item()
        check = {"transformers": transformers.__version__, "max_abs_diff": diff,
                 "max_abs_logit": theirs.abs().max().item(),
                 "argmax_agree": (mine.argmax(-1) == theirs.argmax(-1)).float().mean().item()}
    except Exception as e:  # reported, not fatal: strata convert does not need transformers
        check = {"error": repr(e)}
    log("transformers check: " + json.dumps(check))
    if a.strata:
        try:
            check["strata"] = strata_check(a, model.float(), held_ids, a.out)
        except Exception as e:
            check["strata"] = {"error": repr(e)}
            log("strata check failed: " + repr(e))
    with open(os.path.join(a.out, "check.json"), "w") as f:
        json.dump(check, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

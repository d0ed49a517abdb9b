#!/usr/bin/env python3
"""compare_qwen3moe: strata against Hugging Face transformers on random-weight Qwen3-MoE
checkpoints (the whole-model check of DESIGN.md §8). Method and tolerances: docs/hf-reference.md.

For each of two model configurations (A: hidden 256, 4 layers, 16 experts top-4, saved per
expert in 2 shards; B: hidden 512, 3 layers, 32 experts top-8, head_dim != hidden/heads, saved
with fused experts where transformers can), it

  1. builds a random-init Qwen3MoeForCausalLM in float32 (eager attention), with matrices drawn
     from N(0, --init-std^2) and every norm weight from 1 + N(0, 0.1^2), saves it with
     save_pretrained next to the given tokenizer.json / tokenizer_config.json;
  2. runs `strata convert --quant f32|bf16|q8_0` on the directory;
  3. for each prompt (tokenized by `tokenizers`, passed to both as ids) runs
     `strata logits --greedy N` and compares, block by block, with transformers' logits at the
     same positions (teacher-forced on strata's tokens), and strata's greedy tokens with
     transformers' own argmax loop; f32 also compares a one-token-at-a-time prefill
     (--decode-one-by-one) with the batched one;
  4. asserts for f32: max |strata - hf| / max |hf| <= 1e-3 in every block, and the same greedy
     tokens (a divergence where transformers' top-2 gap is within twice the measured error is
     reported as a near-tie and not counted as a failure unless --strict-greedy);
  5. writes a small reference for CI (DIR/ci-ref/): a tiny model with a tiny synthetic
     tokenizer, its strata f32 GGUF, transformers' logits and greedy ids (tests/test_hf_ref.c).

Prints a summary table and writes DIR/summary.md. Exit code 0 when the f32 criteria hold,
1 when they fail, 2 on a setup error.

Needs Python 3.10+, numpy, torch, transformers (5.x or 4.5x), tokenizers. `--self-test` runs the
parts that need no torch (tokenizer and checkpoint writers, strata invocation, comparisons)
against a numpy float64 forward instead of transformers.
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

F32_TOL = 1e-3  # max |strata - hf| / max |hf| per logits block, f32 file

CONFIGS = {
    "A": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
              save="per-expert, 2 shards"),
    "B": dict(hidden_size=512, num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=2,
              head_dim=64, num_experts=32, num_experts_per_tok=8, moe_intermediate_size=256,
              save="fused experts"),
}
CI_CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 save="per-expert")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a land far, far away, there lived a",
    "1 + 1 = 2, 2 + 2 = 4, 3 + 3 =",
    "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n<|im_start|>assistant\n",
    "今天天气很好，我们去公园散步吧。",
]
CI_PROMPTS = [
    "the quick brown fox",
    "hello world, hello there",
    "1 + 2 = 3",
    "<|im_start|>user\nthe cat<|im_end|>\n",
]

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def log(msg):
    print(msg, flush=True)


class SetupError(Exception):
    pass


# ---- tiny synthetic tokenizer (CI reference) ----------------------------------------------------

def gpt2_byte_map():
    """Byte -> the character that stands for it in byte-level BPE token text (docs/formats.md §5)."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, extra = {}, 0
    for b in range(256):
        if b in printable:
            m[b] = chr(b)
        else:
            m[b] = chr(0x100 + extra)
            extra += 1
    return m


TINY_CORPUS = (
    "the quick brown fox jumps over the lazy dog. hello world, hello there! "
    "the cat sat on the mat and the dog sat on the log. 1 + 2 = 3, 2 + 3 = 5. "
    "there is a theory that the other thing is better than the rest of them. "
) * 4


def tiny_tokenizer(n_merges=40):
    """A byte-level BPE tokenizer.json (qwen2 pre-tokenizer) with merges learned on a fixed text;
    returns (tokenizer dict, tokenizer_config dict, token count)."""
    bm = gpt2_byte_map()
    pieces = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", TINY_CORPUS)
    words = {}
    for p in pieces:
        key = tuple(bm[b] for b in p.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    vocab = {bm[b]: b for b in range(256)}
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))  # most frequent, then lexical: stable
        merges.append([best[0], best[1]])
        vocab[best[0] + best[1]] = len(vocab)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = []
    for s in specials:
        added.append(dict(id=len(vocab) + len(added), content=s, single_word=False, lstrip=False,
                          rstrip=False, normalized=False, special=True))
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    cfg = {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
           "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, cfg, len(vocab) + len(added)


# ---- safetensors (pure python + numpy) ---------------------------------------------------------

def safetensors_names(hf_dir):
    """All tensor names of a checkpoint directory (single file or index)."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    names = []
    for f in files:
        with open(os.path.join(hf_dir, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    return names, len(files)


def expert_layout(hf_dir):
    names, n_files = safetensors_names(hf_dir)
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
    per = any(re.search(r"mlp\.experts\.\d+\.gate_proj\.weight$", n) for n in names)
    kind = "fused" if fused and not per else "per-expert" if per and not fused else "mixed"
    return f"{kind}, {n_files} file{'s' if n_files > 1 else ''}"


def safetensors_write(path, tensors):
    """tensors: {name: float32 numpy array}, written as F32."""
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


# ---- strata -------------------------------------------------------------------------------------

def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SetupError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n"
                         f"{p.stderr[-3000:]}")
    return p


def strata_convert(args, hf_dir, out, quant):
    t0 = time.time()
    run([args.strata, "convert", hf_dir, "-o", out, "--quant", quant, "--threads",
         str(args.threads), "--name", os.path.basename(hf_dir), "-q"], f"strata convert {quant}")
    return time.time() - t0


def strata_logits(args, gguf, ids, n_greedy, one_by_one=False, text=None):
    """Returns (prompt ids, greedy ids, blocks (1 + n_greedy, n_vocab) float32)."""
    with tempfile.NamedTemporaryFile(suffix=".bin", dir=args.work) as tmp:
        cmd = [args.strata, "logits", "-m", gguf, "--greedy", str(n_greedy), "-o", tmp.name,
               "-t", str(args.threads)]
        cmd += ["-p", text] if text is not None else ["--ids", ",".join(map(str, ids))]
        if one_by_one:
            cmd.append("--decode-one-by-one")
        if args.strata_device != "cpu":
            cmd += ["--device", args.strata_device]
        p = run(cmd, "strata logits")
        blocks = np.fromfile(tmp.name, dtype="<f4")
    got_ids, greedy = None, []
    for line in p.stdout.splitlines():
        if line.startswith("ids:"):
            got_ids = [int(x) for x in line[4:].split()]
        elif line.startswith("greedy:"):
            greedy = [int(x) for x in line[7:].split()]
    if got_ids is None or len(greedy) != n_greedy or blocks.size % (n_greedy + 1):
        raise SetupError(f"unexpected strata logits output:\n{p.stdout[-2000:]}")
    return got_ids, greedy, blocks.reshape(n_greedy + 1, -1)


# ---- comparisons --------------------------------------------------------------------------------

def rel_err(a, b):
    """max |a - b| / max |b| (inf when a has NaN/inf)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def file_roundtrip(a, quant):
    """The values a float32 matrix (rows along the last axis) has after strata convert wrote it
    as `quant` and it was read back: bf16 rounds to nearest even; q8_0 mirrors
    cpu_kernels/quant_ref.c (d = max|x|/127, q = round(x * (1/d)) half away from zero, d
    stored as f16)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if quant == "bf16":
        u = a.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return r.astype(np.uint32).view(np.float32).reshape(a.shape)
    if quant == "q8_0":
        x = a.reshape(-1, 32)
        d = (np.max(np.abs(x), axis=1) / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        v = (x * inv[:, None]).astype(np.float32)
        q = np.clip(np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5), -127, 127)
        d16 = d.astype(np.float16).astype(np.float32)
        return (q.astype(np.float32) * d16[:, None]).astype(np.float32).reshape(a.shape)
    return a


def file_quantized(name, ndim):
    """Whether the bf16 / q8_0 mixes store this HF tensor in the mix's type (matrices but the
    router)."""
    return ndim >= 2 and not name.endswith("mlp.gate.weight")


def compare_case(s_blocks, s_greedy, ref_blocks, ref_greedy):
    """ref_blocks: reference logits teacher-forced on strata's tokens (same positions as
    s_blocks); ref_greedy: the reference's own greedy tokens. Returns a dict of measures."""
    errs = [rel_err(s_blocks[i], ref_blocks[i]) for i in range(len(s_blocks))]
    n = len(s_greedy)
    agree = next((i for i in range(n) if s_greedy[i] != ref_greedy[i]), n)
    tie = False
    if agree < n:
        blk = ref_blocks[agree].astype(np.float64)
        gap = blk[ref_greedy[agree]] - blk[s_greedy[agree]]
        abs_err = float(np.max(np.abs(s_blocks[agree] - blk)))
        tie = gap <= 2 * abs_err
    return dict(err0=errs[0], err_max=max(errs), agree=agree, n=n, tie=tie)


# ---- numpy float64 reference forward (--self-test) ---------------------------------------------

def np_forward(w, cfg, ids):
    """Qwen3-MoE forward in float64 with the semantics of transformers' modeling_qwen3_moe
    (softmax -> top-k -> renormalize); returns logits (len(ids), vocab)."""
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    k, eps = cfg["num_experts_per_tok"], cfg["rms_norm_eps"]

    def g(name):
        return w[name].astype(np.float64)

    def rms(x, wt):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * wt

    def rot(v):  # rotate_half RoPE on (T, heads, hd)
        half = np.concatenate([-v[..., hd // 2:], v[..., :hd // 2]], -1)
        return v * cos[:, None] + half * sin[:, None]

    T = len(ids)
    x = g("model.embed_tokens.weight")[ids]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, g(p + "input_layernorm.weight"))
        q = (h @ g(p + "self_attn.q_proj.weight").T).reshape(T, nh, hd)
        kk = (h @ g(p + "self_attn.k_proj.weight").T).reshape(T, nkv, hd)
        v = (h @ g(p + "self_attn.v_proj.weight").T).reshape(T, nkv, hd)
        q = rot(rms(q, g(p + "self_attn.q_norm.weight")))
        kk = rot(rms(kk, g(p + "self_attn.k_norm.weight")))
        att = np.zeros((T, nh, hd))
        for j in range(nh):
            s = q[:, j] @ kk[:, j // (nh // nkv)].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, j] = (s / s.sum(-1, keepdims=True)) @ v[:, j // (nh // nkv)]
        x = x + att.reshape(T, nh * hd) @ g(p + "self_attn.o_proj.weight").T
        h = rms(x, g(p + "post_attention_layernorm.weight"))
        r = h @ g(p + "mlp.gate.weight").T
        r = np.exp(r - r.max(-1, keepdims=True))
        r /= r.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-r[t], kind="stable")[:k]
            wt = r[t, top] / r[t, top].sum()
            for e, we in zip(top, wt):
                pe = p + f"mlp.experts.{e}."
                a = h[t] @ g(pe + "gate_proj.weight").T
                u = h[t] @ g(pe + "up_proj.weight").T
                out[t] += we * (g(pe + "down_proj.weight") @ (a / (1 + np.exp(-a)) * u))
        x = x + out
    return rms(x, g("model.norm.weight")) @ g("lm_head.weight").T


def np_random_checkpoint(cfg, vocab, std, seed):
    rng = np.random.default_rng(seed)
    H, nh, nkv, hd, E, F = (cfg["hidden_size"], cfg["num_attention_heads"],
                            cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_experts"],
                            cfg["moe_intermediate_size"])
    mat = lambda *s: rng.normal(0, std, s).astype(np.float32)  # noqa: E731
    nrm = lambda n: (1 + 0.1 * rng.normal(size=n)).astype(np.float32)  # noqa: E731
    w = {"model.embed_tokens.weight": mat(vocab, H)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w.update({p + "input_layernorm.weight": nrm(H),
                  p + "self_attn.q_proj.weight": mat(nh * hd, H),
                  p + "self_attn.k_proj.weight": mat(nkv * hd, H),
                  p + "self_attn.v_proj.weight": mat(nkv * hd, H),
                  p + "self_attn.o_proj.weight": mat(H, nh * hd),
                  p + "self_attn.q_norm.weight": nrm(hd), p + "self_attn.k_norm.weight": nrm(hd),
                  p + "post_attention_layernorm.weight": nrm(H), p + "mlp.gate.weight": mat(E, H)})
        for e in range(E):
            w[p + f"mlp.experts.{e}.gate_proj.weight"] = mat(F, H)
            w[p + f"mlp.experts.{e}.up_proj.weight"] = mat(F, H)
            w[p + f"mlp.experts.{e}.down_proj.weight"] = mat(H, F)
    w["model.norm.weight"] = nrm(H)
    w["lm_head.weight"] = mat(vocab, H)
    return w


# ---- transformers -------------------------------------------------------------------------------

def eager_model(cls, conf, seed):
    """cls(conf) in float32 with eager attention and, in transformers 5.x, the plain experts
    loop, its parameters initialised from torch seed `seed`."""
    import torch
    conf._attn_implementation = "eager"
    try:
        conf._experts_implementation = "eager"  # transformers 5.x: the plain loop
    except Exception:  # noqa: BLE001 - older versions have no such setting
        pass
    torch.manual_seed(seed)
    model = cls(conf).float()
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log(f"  note: set_experts_implementation('eager'): {e}")
    return model


class HF:
    """Random-init Qwen3MoeForCausalLM in float32 with eager attention."""

    def __init__(self, args, cfg, vocab):
        import torch
        import transformers
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        self.torch = torch
        self.dev = torch.device(args.device)
        if self.dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        kw = dict(vocab_size=vocab, hidden_size=cfg["hidden_size"],
                  intermediate_size=4 * cfg["moe_intermediate_size"],
                  num_hidden_layers=cfg["num_hidden_layers"],
                  num_attention_heads=cfg["num_attention_heads"],
                  num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                  num_experts=cfg["num_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                  moe_intermediate_size=cfg["moe_intermediate_size"], norm_topk_prob=True,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                  attention_bias=False, initializer_range=args.init_std,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
        conf = None
        for rope in ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                     {"rope_theta": 1000000.0}):  # transformers 5.x, then 4.x
            for extra in ({}, {"head_dim"}):  # head_dim as a field, else set afterwards
                try:
                    conf = Qwen3MoeConfig(**{k: v for k, v in kw.items() if k not in extra},
                                          **rope)
                    break
                except TypeError:
                    continue
            if conf is not None:
                break
        if conf is None:
            raise SetupError("cannot build a Qwen3MoeConfig with these keys")
        conf.head_dim = cfg["head_dim"]
        self.model = eager_model(Qwen3MoeForCausalLM, conf, args.seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, args.init_std)
                else:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        self.model.eval().to(self.dev)
        attn = self.model.model.layers[0].self_attn
        got = (attn.q_proj.weight.shape[0], self.model.model.layers[0].mlp.gate.weight.shape[0])
        want = (cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_experts"])
        if got != want:
            raise SetupError(f"transformers built q_proj/router rows {got}, expected {want}: "
                             "head_dim or num_experts was not taken from the config")
        impl = getattr(self.model.config, "_attn_implementation", "?")
        if impl != "eager":
            raise SetupError(f"attention implementation is {impl}, expected eager")
        experts = getattr(self.model.config, "_experts_implementation", None)
        self.versions = (f"torch {torch.__version__}, transformers {transformers.__version__}"
                         f" (float32, attention {impl}"
                         + (f", experts {experts}" if experts else "") + ")")

    def save(self, path, fused, shards):
        kw = {}
        if shards:
            kw["max_shard_size"] = shards
        if fused:
            kw["save_original_format"] = False
        try:
            self.model.save_pretrained(path, **kw)
        except TypeError:
            kw.pop("save_original_format", None)
            self.model.save_pretrained(path, **kw)
        cfg_path = os.path.join(path, "config.json")
        c = json.load(open(cfg_path))
        if "head_dim" not in c:  # the converter needs it when head_dim != hidden / heads
            c["head_dim"] = self.model.model.layers[0].self_attn.head_dim
            json.dump(c, open(cfg_path, "w"), indent=2)

    def requantized(self, quant):
        """A copy whose weights are the values of a `quant` file (see file_roundtrip)."""
        import copy
        torch = self.torch
        other = copy.copy(self)
        other.model = copy.deepcopy(self.model)
        with torch.no_grad():
            for name, p in other.model.named_parameters():
                if file_quantized(name, p.dim()):
                    p.copy_(torch.from_numpy(file_roundtrip(p.detach().cpu().numpy(), quant)))
        return other

    def last_logits(self, ids, k):
        """float32 logits (k, vocab) of the last k positions of one forward over ids."""
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long, device=self.dev)
            h = self.model.model(input_ids=x, use_cache=False).last_hidden_state[0, -k:]
            return self.model.lm_head(h).float().cpu().numpy()

    def greedy(self, ids, n):
        seq, out = list(ids), []
        for _ in range(n):
            t = int(np.argmax(self.last_logits(seq, 1)[0]))
            out.append(t)
            seq.append(t)
        return out


class NumpyRef:
    """The --self-test stand-in for HF: a numpy float64 forward over the same weights."""

    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg
        self.versions = f"numpy {np.__version__} float64 reference (self-test)"

    def requantized(self, quant):
        return NumpyRef({n: file_roundtrip(a, quant) if file_quantized(n, a.ndim) else a
                         for n, a in self.w.items()}, self.cfg)

    def last_logits(self, ids, k):
        return np_forward(self.w, self.cfg, ids)[-k:]

    def greedy(self, ids, n):
        seq, out = list(ids), []
        for _ in range(n):
            t = int(np.argmax(self.last_logits(seq, 1)[0]))
            out.append(t)
            seq.append(t)
        return out


# ---- one configuration --------------------------------------------------------------------------

def write_tokenizer_files(dst, tok_json, tok_cfg):
    with open(os.path.join(dst, "tokenizer.json"), "w") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, ensure_ascii=False, indent=2)


def copy_tokenizer(src_json, dst):
    shutil.copy(src_json, os.path.join(dst, "tokenizer.json"))
    cfg = os.path.join(os.path.dirname(src_json), "tokenizer_config.json")
    if os.path.exists(cfg):
        shutil.copy(cfg, os.path.join(dst, "tokenizer_config.json"))


def encode_all(args, tokenizer_json, prompts, gguf=None):
    """Token ids by Hugging Face `tokenizers`; without it (--self-test only), by strata."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        if not args.self_test or not gguf:
            raise
        return [strata_logits(args, gguf, None, 0, text=p)[0] for p in prompts]
    tok = Tokenizer.from_file(tokenizer_json)
    return [tok.encode(p).ids for p in prompts]


def evaluate(args, name, ref, hf_dir, prompts_ids, quants, rows, details, prompt_texts=None):
    """Converts hf_dir to each quant and compares strata with ref on every prompt."""
    ref_greedy = [ref.greedy(ids, args.greedy) for ids in prompts_ids]
    layout = expert_layout(hf_dir)
    for q in quants:
        gguf = os.path.join(args.work, f"{name}-{q}.gguf")
        secs = strata_convert(args, hf_dir, gguf, q)
        size = os.path.getsize(gguf) / 1e6
        matched = ref.requantized(q) if q != "f32" else None
        cases = []
        for i, ids in enumerate(prompts_ids):
            _, s_greedy, s_blocks = strata_logits(args, gguf, ids, args.greedy)
            ref_blocks = ref.last_logits(list(ids) + s_greedy, args.greedy + 1)
            c = compare_case(s_blocks, s_greedy, ref_blocks, ref_greedy[i])
            if matched is not None:  # the same weights as the file: what the kernels add
                m_blocks = matched.last_logits(list(ids) + s_greedy, args.greedy + 1)
                c["err_matched"] = max(rel_err(s_blocks[j], m_blocks[j])
                                       for j in range(len(s_blocks)))
            if q == "f32":
                _, _, one = strata_logits(args, gguf, ids, 0, one_by_one=True)
                c["pd"] = rel_err(one[0], s_blocks[0])
                if prompt_texts is not None:
                    got, _, _ = strata_logits(args, gguf, None, 0, text=prompt_texts[i])
                    c["tok_ok"] = got == list(ids)
            c["f32_ok"] = c["err_max"] <= F32_TOL and (
                c["agree"] == c["n"] or (c["tie"] and not args.strict_greedy))
            cases.append(c)
            pd = f"{c['pd']:.2e}" if "pd" in c else "-"
            em = f"{c['err_matched']:.2e}" if "err_matched" in c else "-"
            details.append(f"| {name} | {q} | {i} | {len(ids)} | {c['err0']:.2e} | "
                           f"{c['err_max']:.2e} | {em} | {c['agree']}/{c['n']}"
                           f"{' (near-tie)' if c['tie'] else ''} | {pd} |")
        row = dict(config=name, quant=q, layout=layout, size_mb=size, convert_s=secs,
                   err0=max(c["err0"] for c in cases), err_max=max(c["err_max"] for c in cases),
                   agree_min=min(c["agree"] for c in cases), n=args.greedy,
                   full=sum(c["agree"] == c["n"] for c in cases), prompts=len(cases),
                   ties=sum(c["tie"] for c in cases),
                   pd=max((c.get("pd", 0.0) for c in cases), default=0.0),
                   err_matched=max((c.get("err_matched", 0.0) for c in cases), default=0.0),
                   tok=(sum(c.get("tok_ok", False) for c in cases)
                        if prompt_texts is not None and q == "f32" else None),
                   ok=all(c["f32_ok"] for c in cases) if q == "f32" else None)
        rows.append(row)
        log(f"  {name} {q:5s}: {size:7.1f} MB in {secs:5.1f} s; max rel err block0 "
            f"{row['err0']:.2e}, all blocks {row['err_max']:.2e}"
            + (f" (vs the file's own weights {row['err_matched']:.2e})" if q != "f32" else "")
            + "; greedy identical "
            f"{row['full']}/{row['prompts']} (shortest agreement {row['agree_min']}/{args.greedy},"
            f" near-ties {row['ties']})" + (f"; prefill vs decode {row['pd']:.2e}"
                                            if q == "f32" else "")
            + ("" if row["ok"] is None else f"; f32 criteria {'PASS' if row['ok'] else 'FAIL'}"))


def ci_reference(args, ref_factory, rows, details):
    """The tiny model for tests/data/hf-ref/: HF dir, strata f32 GGUF, reference logits."""
    out = os.path.join(args.out, "ci-ref")
    hf_dir = os.path.join(out, "hf")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(hf_dir)
    tok_json, tok_cfg, n_tok = tiny_tokenizer()
    write_tokenizer_files(hf_dir, tok_json, tok_cfg)
    vocab = (n_tok + 7) // 8 * 8
    ref = ref_factory(CI_CONFIG, vocab, hf_dir, args.ci_init_std)
    gguf = os.path.join(out, "model.gguf")
    run([args.strata, "convert", hf_dir, "-o", gguf, "--quant", "f32", "--name", "hf-ref-tiny",
         "-q"], "strata convert (ci-ref)")
    ids_all = encode_all(args, os.path.join(hf_dir, "tokenizer.json"), CI_PROMPTS, gguf)
    blocks, cases = [], []
    for i, (text, ids) in enumerate(zip(CI_PROMPTS, ids_all)):
        greedy = ref.greedy(ids, args.greedy)
        blocks.append(ref.last_logits(list(ids) + greedy, args.greedy + 1).astype(np.float32))
        cases.append(dict(text=text, ids=list(ids), greedy=greedy, block0=i * (args.greedy + 1)))
    np.concatenate(blocks).astype("<f4").tofile(os.path.join(out, "logits.bin"))
    meta = dict(model="model.gguf", hf_dir="hf", logits="logits.bin", n_vocab=vocab,
                n_greedy=args.greedy, tolerance=F32_TOL, seed=args.seed,
                init_std=args.ci_init_std, config={k: v for k, v in CI_CONFIG.items()
                                                   if k != "save"},
                reference=ref.versions,
                note="logits.bin: for each case, 1 + n_greedy blocks of n_vocab float32: the "
                     "reference's logits after the prompt and after each of its greedy tokens "
                     "(teacher-forced on those tokens); block0 is the case's first block.",
                cases=cases)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    evaluate(args, "ci-ref", ref, hf_dir, ids_all, ["f32"], rows, details, CI_PROMPTS)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    log(f"  ci-ref: {out} ({size / 1e6:.2f} MB): copy it to tests/data/hf-ref/")


# ---- summary ------------------------------------------------------------------------------------

def summary(args, rows, details, versions, elapsed):
    lines = [
        "# strata vs Hugging Face transformers: random-weight Qwen3-MoE",
        "",
        f"Reference: {versions}. Device {args.device}; strata backend {args.strata_device}, "
        f"threads {args.threads}; "
        f"init std {args.init_std} (ci-ref {args.ci_init_std}), norms 1 + N(0, 0.1^2); "
        f"seed {args.seed}; {args.greedy} greedy tokens; {elapsed:.0f} s.",
        "",
        "Configs: " + "; ".join(f"{k}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers,"
                                f" {c['num_attention_heads']}/{c['num_key_value_heads']} heads of "
                                f"{c['head_dim']}, {c['num_experts']} experts top-"
                                f"{c['num_experts_per_tok']} of {c['moe_intermediate_size']}"
                                for k, c in list(CONFIGS.items()) + [("ci-ref", CI_CONFIG)]),
        "",
        "err = max |strata - ref| / max |ref| per logits block (block 0 = after the prompt; "
        "blocks 1.. after each greedy token, reference teacher-forced on strata's tokens). "
        f"f32 criteria: err <= {F32_TOL:g} in every block and identical greedy tokens.",
        "",
        "\"matched err\": the same measure against the reference with its weights replaced by "
        "the file's (bf16-rounded, or Q8_0 round-tripped as cpu_kernels/quant_ref.c does; norms "
        "and router stay f32): the error strata's kernels add beyond the weights' quantization. "
        "A greedy divergence counts as a near-tie when the reference's gap between the two "
        "tokens is within twice the block's max abs error.",
        "",
        "| config | quant | experts saved | file MB | block-0 err | max err | matched err |"
        " greedy identical | shortest agreement | prefill vs decode | tokenizer | f32 criteria |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ties = f" ({r['ties']} near-tie)" if r["ties"] else ""
        pd = f"{r['pd']:.2e}" if r["quant"] == "f32" else "-"
        tok = f"{r['tok']}/{r['prompts']}" if r["tok"] is not None else "-"
        ok = "-" if r["ok"] is None else "PASS" if r["ok"] else "FAIL"
        em = f"{r['err_matched']:.2e}" if r["quant"] != "f32" else "-"
        lines.append(f"| {r['config']} | {r['quant']} | {r['layout']} | {r['size_mb']:.1f} | "
                     f"{r['err0']:.2e} | {r['err_max']:.2e} | {em} | "
                     f"{r['full']}/{r['prompts']}{ties} | {r['agree_min']}/{r['n']} | {pd} | "
                     f"{tok} | {ok} |")
    lines += ["", "Per prompt:", "",
              "| config | quant | prompt | tokens | block-0 err | max err | matched err |"
              " greedy agreement | prefill vs decode |", "|---|---|---|---|---|---|---|---|---|"]
    lines += details
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print("\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True, help="path of the strata binary")
    ap.add_argument("--tokenizer", help="tokenizer.json for configs A and B (Qwen3's); "
                    "tokenizer_config.json next to it is copied too")
    ap.add_argument("--out", required=True, help="summary.md and ci-ref/ go here")
    ap.add_argument("--work", help="checkpoints and GGUF files (default: a temp dir, removed)")
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--quants", default="f32,bf16,q8_0")
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--init-std", type=float, default=0.08)
    ap.add_argument("--ci-init-std", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", help="torch device of the reference (cpu, cuda)")
    ap.add_argument("--strata-device", default="cpu", choices=["cpu", "cuda"],
                    help="strata's backend (strata logits --device)")
    ap.add_argument("--vocab-size", type=int, help="default: 151936 for a Qwen tokenizer, else "
                    "the tokenizer's size rounded up to 64")
    ap.add_argument("--strict-greedy", action="store_true",
                    help="count a greedy divergence at a near-tie as a failure")
    ap.add_argument("--no-ci-ref", action="store_true")
    ap.add_argument("--self-test", action="store_true",
                    help="no torch: numpy float64 reference on small numpy-written checkpoints")
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    tmp = None
    if not args.work:
        tmp = args.work = tempfile.mkdtemp(prefix="strata-hf-")
    os.makedirs(args.work, exist_ok=True)
    rows, details = [], []
    try:
        if args.self_test:
            versions = self_test(args, rows, details)
        else:
            versions = hf_run(args, rows, details)
    except SetupError as e:
        print(f"compare_qwen3moe: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    summary(args, rows, details, versions, time.time() - t0)
    failed = [r for r in rows if r["ok"] is False]
    if failed:
        print("f32 criteria FAILED for: " + ", ".join(r["config"] for r in failed))
        return 1
    return 0


def hf_run(args, rows, details):
    import torch
    torch.set_num_threads(args.threads)
    if not args.tokenizer:
        raise SetupError("--tokenizer PATH/tokenizer.json is required")
    n_tok = json.load(open(args.tokenizer))
    n_tok = len(n_tok["model"]["vocab"]) + sum(
        1 for a in n_tok.get("added_tokens", []) if a["content"] not in n_tok["model"]["vocab"])
    vocab = args.vocab_size or (151936 if 151000 < n_tok <= 151936 else (n_tok + 63) // 64 * 64)
    prompts_ids = encode_all(args, args.tokenizer, PROMPTS)
    versions = None
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        log(f"config {name}: {cfg}, vocab {vocab}")
        hf = HF(args, cfg, vocab)
        versions = hf.versions
        hf_dir = os.path.join(args.work, f"hf-{name}")
        fused = "fused" in cfg["save"]
        hf.save(hf_dir, fused=fused, shards="100MB" if "shards" in cfg["save"] else None)
        copy_tokenizer(args.tokenizer, hf_dir)
        evaluate(args, name, hf, hf_dir, prompts_ids, args.quants.split(","), rows, details,
                 PROMPTS)
        del hf
    if not args.no_ci_ref:
        def factory(cfg, vocab, hf_dir, std):
            a = argparse.Namespace(**vars(args))
            a.init_std = std
            h = HF(a, cfg, vocab)
            h.save(hf_dir, fused=False, shards=None)
            gen = os.path.join(hf_dir, "generation_config.json")  # not needed by the test
            if os.path.exists(gen):
                os.remove(gen)
            return h
        ci_reference(args, factory, rows, details)
    return versions


def np_fuse_experts(w, cfg):
    """The transformers 5.x in-memory layout: gate_up_proj [E, 2F, H], down_proj [E, H, F]."""
    out = {}
    for n, a in w.items():
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight$", n)
        if not m:
            out[n] = a
        elif m.group(2) == "0" and m.group(3) == "gate_proj":
            p, E = m.group(1), cfg["num_experts"]
            out[p + ".gate_up_proj"] = np.stack([np.concatenate(
                [w[f"{p}.{e}.gate_proj.weight"], w[f"{p}.{e}.up_proj.weight"]]) for e in range(E)])
            out[p + ".down_proj"] = np.stack([w[f"{p}.{e}.down_proj.weight"] for e in range(E)])
    return out


def self_test(args, rows, details):
    """Torch-free run: numpy-written checkpoints against the numpy float64 forward."""
    def factory(cfg, vocab, hf_dir, std):
        c = dict(cfg, rms_norm_eps=1e-6, rope_theta=1000000.0)
        w = np_random_checkpoint(c, vocab, std, args.seed)
        safetensors_write(os.path.join(hf_dir, "model.safetensors"),
                          np_fuse_experts(w, c) if "fused" in cfg["save"] else w)
        conf = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    vocab_size=vocab, max_position_embeddings=4096, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, norm_topk_prob=True, tie_word_embeddings=False,
                    **{k: v for k, v in cfg.items() if k != "save"})
        with open(os.path.join(hf_dir, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
        return NumpyRef(w, c)
    args.greedy = min(args.greedy, 8)
    tok_json, tok_cfg, n_tok = tiny_tokenizer()
    for name in args.configs.split(","):
        hf_dir = os.path.join(args.work, f"hf-{name}")
        os.makedirs(hf_dir)
        write_tokenizer_files(hf_dir, tok_json, tok_cfg)
        ref = factory(CONFIGS[name], (n_tok + 7) // 8 * 8, hf_dir, args.init_std)
        gguf = os.path.join(args.work, f"{name}-tok.gguf")
        run([args.strata, "convert", hf_dir, "-o", gguf, "--quant", "f32", "-q"], "convert")
        ids = encode_all(args, os.path.join(hf_dir, "tokenizer.json"), CI_PROMPTS, gguf)
        log(f"config {name} (self-test, vocab {(n_tok + 7) // 8 * 8})")
        evaluate(args, name, ref, hf_dir, ids, args.quants.split(","), rows, details,
                 CI_PROMPTS)
    if not args.no_ci_ref:
        ci_reference(args, factory, rows, details)
    return f"numpy {np.__version__} float64 forward (--self-test)"


if __name__ == "__main__":
    sys.exit(main())

/* gen: the synthetic checkpoint generator behind `strata gen`.
 *
 * It writes a GGUF file of a real architecture (qwen3moe, gpt-oss, and the hybrid Gated
 * DeltaNet + gated attention qwen3next and qwen35moe) at a preset's shapes with
 * random but well-scaled weights, so that the engine can be run, tested and benchmarked at real
 * sizes without downloading a checkpoint. Quantized blocks are drawn directly as valid codes and
 * scales (no float quantization pass), in parallel over fixed chunks of each tensor, each chunk
 * with its own random stream derived from (seed, tensor index, chunk index): the same seed and
 * arguments give a byte-identical file whatever the thread count.
 *
 * Scaling rules (dequantized values): a weight of fan-in n has mean ~0 and std ~1/sqrt(n);
 * token embeddings have std 1; norm weights are 1 + N(0, 0.05^2); the Gated DeltaNet's conv,
 * dt bias and A (strictly negative) have rules of their own. Details: docs/gen.md.
 *
 * Pieces: presets.c (presets, quant mixes), draw.c (block drawing), vocab.c and corpus.c
 * (byte-level BPE vocabulary), gen.c (file layout, worker threads, progress).
 */
#ifndef STRATA_GEN_H
#define STRATA_GEN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "quant_mix.h"
#include "rng.h"

/* ---- presets ------------------------------------------------------------------------------ */

/* The shapes and hyper-parameters of one model size. */
struct gen_preset {
    const char *arch;       /* general.architecture: "qwen3moe", "gpt-oss", "qwen3next" or
                               "qwen35moe" */
    const char *name;       /* "tiny", "30b-a3b", "235b-a22b", "20b", "120b", "80b-a3b",
                               "35b-a3b"; may be NULL in a custom one */
    const char *model_name; /* general.name stem, e.g. "Qwen3-30B-A3B"; may be NULL */
    uint32_t n_layer;       /* block_count */
    uint32_t n_ctx;         /* context_length */
    uint32_t n_embd;        /* embedding_length */
    uint32_t n_ff;          /* feed_forward_length (dense size; unused by the MoE forward; not
                               written for qwen3next and qwen35moe) */
    uint32_t n_ff_exp;      /* expert_feed_forward_length */
    uint32_t n_expert;      /* expert_count */
    uint32_t n_expert_used; /* expert_used_count (top-k) */
    uint32_t n_head;        /* attention.head_count */
    uint32_t n_head_kv;     /* attention.head_count_kv */
    uint32_t head_dim;      /* attention.key_length = value_length */
    uint32_t n_vocab;       /* rows of token_embd / output */
    uint32_t special_base;  /* id of <|endoftext|> (then <|im_start|>, <|im_end|>);
                               0 = the last three ids */
    float rms_eps;          /* attention.layer_norm_rms_epsilon */
    float rope_base;        /* rope.freq_base */
    /* gpt-oss only (0 for qwen3moe) */
    uint32_t n_swa;         /* attention.sliding_window (even layers slide) */
    float yarn_factor;      /* rope.scaling.factor (type yarn) */
    uint32_t yarn_n_ctx_orig; /* rope.scaling.original_context_length */
    /* qwen3next and qwen35moe only (0 elsewhere): layer l is full attention iff
     * (l + 1) % full_attn_interval == 0, else Gated DeltaNet (GDN). The GDN q/k heads are
     * ssm_n_group, its v heads ssm_dt_rank, both of dim ssm_d_state. */
    uint32_t n_ff_shexp;         /* expert_shared_feed_forward_length (the shared expert) */
    uint32_t n_rot;              /* rope.dimension_count: rotated dims of each head (even) */
    uint32_t ssm_d_conv;         /* ssm.conv_kernel: taps of the causal depthwise conv */
    uint32_t ssm_d_state;        /* ssm.state_size: GDN head dim (q/k and v) */
    uint32_t ssm_n_group;        /* ssm.group_count: GDN q/k heads */
    uint32_t ssm_dt_rank;        /* ssm.time_step_rank: GDN v heads, a multiple of ssm_n_group */
    uint32_t full_attn_interval; /* full_attention_interval */
    uint32_t n_nextn;       /* nextn_predict_layers: 0, or 1 MTP block written after the layers
                               (block n_layer: nextn.* and a full-attention layer); block_count
                               counts it */
};

/* The built-in presets, in the order --help lists them; *n receives their count. */
const struct gen_preset *gen_presets(uint32_t *n);

/* The qwen3moe preset called name, or NULL. */
const struct gen_preset *gen_preset_find(const char *name);

/* The preset of architecture arch called name, or NULL. */
const struct gen_preset *gen_preset_find_arch(const char *arch, const char *name);

/* Quant mixes: core/quant_mix.h (gen draws f32, q8_0 and q4_k_m; bf16 is refused). */

/* ---- drawing ------------------------------------------------------------------------------ */

/* Fills n values (a multiple of the type's block) of `type` at dst, drawn from r:
 * F32: normal(mean, std^2); quantized types (Q8_0, Q4_K, Q5_K, Q6_K): codes and scales drawn
 * directly so that the dequantized values have mean ~0 and std ~std (mean must be 0).
 * Returns 0 or -EINVAL (unsupported type, n not a block multiple, nonzero mean). */
int gen_blocks_draw(uint32_t type, void *dst, uint64_t n, float mean, float std, struct rng *r);

/* Whether gen_blocks_draw supports the type. */
bool gen_blocks_can_draw(uint32_t type);

/* ---- vocabulary --------------------------------------------------------------------------- */

enum gen_token_type {
    GEN_TOKEN_NORMAL = 1,
    GEN_TOKEN_CONTROL = 3,
    GEN_TOKEN_USER_DEFINED = 4,
    GEN_TOKEN_UNUSED = 5,
};

/* A byte-level BPE vocabulary as GGUF stores it (tokenizer.ggml.*). */
struct gen_vocab {
    uint32_t n_tokens;
    char **tokens;  /* (n_tokens) NUL-terminated UTF-8 in the GPT-2 byte map, owned */
    int32_t *types; /* (n_tokens) enum gen_token_type, owned */
    uint32_t n_merges;
    char **merges;   /* (n_merges) "left right", rank = index, owned */
    uint32_t bos_id; /* <|endoftext|> */
    uint32_t eos_id; /* <|im_end|> */
    uint32_t pad_id; /* <|endoftext|> */
};

/* The GPT-2 byte-to-unicode map: writes the UTF-8 of byte b's code point (1 or 2 bytes) and a
 * NUL into out; returns the length. */
int gen_byte_to_utf8(uint8_t b, char out[3]);

/* Synthetic vocabulary of n_vocab tokens: the 256 byte tokens (id = byte), then merges learned
 * by byte-level BPE over the built-in corpus, `[PAD<id>]` UNUSED tokens where the corpus runs
 * out, and <|endoftext|>, <|im_start|>, <|im_end|> (CONTROL) at special_base (0 = the last
 * three ids). Deterministic. 0 or -errno (-EINVAL if n_vocab < 259 or special_base misplaced). */
int gen_vocab_build(uint32_t n_vocab, uint32_t special_base, struct gen_vocab *out);

/* Loads a Hugging Face tokenizer.json (BPE model: vocab, merges, added_tokens) and pads it with
 * `[PAD<id>]` UNUSED tokens to n_vocab, or to its own size if that is larger. Added tokens
 * become CONTROL (special or spelled <|...|>) or USER_DEFINED. 0 or -errno (message names the file
 * and field). */
int gen_vocab_load(const char *path, uint32_t n_vocab, struct gen_vocab *out);

void gen_vocab_free(struct gen_vocab *v);

/* The built-in training text of the synthetic vocabulary (NUL-terminated, static). */
const char *gen_corpus_text(void);

/* ---- writing a file ----------------------------------------------------------------------- */

/* Called from the thread that runs gen_file_write, about every quarter second while tensor data
 * is written and once when it is complete (done == total). */
typedef void (*gen_progress_fn)(void *arg, uint64_t done_bytes, uint64_t total_bytes,
                                double seconds);

struct gen_config {
    const char *arch;         /* "qwen3moe", "gpt-oss", "qwen3next" or "qwen35moe"; must equal
                                 preset.arch when that is set */
    struct gen_preset preset; /* a copy, with overrides (n_layer) already applied */
    enum quant_mix mix;
    uint64_t seed;
    uint32_t n_threads;       /* worker threads; 0 = online CPUs */
    const char *vocab_path;   /* tokenizer.json, or NULL for the synthetic vocabulary */
    const char *out_path;     /* written via a temp file and renamed on success */
    gen_progress_fn progress; /* may be NULL */
    void *progress_arg;
    volatile sig_atomic_t *cancel; /* abort (-EINTR, temp file removed) once *cancel != 0;
                                      may be NULL; meant to be set from a signal handler */
};

struct gen_stats {
    uint64_t n_tensors;
    uint64_t n_params;   /* weight elements */
    uint64_t data_bytes; /* bytes of tensor data */
    uint64_t n_fallback; /* tensors whose mix type fell back (rows not a block multiple) */
    uint32_t n_vocab;    /* tokens written (after padding) */
    uint32_t n_threads;  /* threads used */
    double seconds;      /* wall time of the whole write */
};

/* Writes the file described by cfg; stats may be NULL. 0 or -errno; on failure nothing is left
 * at out_path and err_msg() names what failed. */
int gen_file_write(const struct gen_config *cfg, struct gen_stats *stats);

/* ---- inflating a small model ------------------------------------------------------------- */

struct gen_inflate_config {
    const char *small_path;   /* a qwen3moe GGUF (any supported types) */
    struct gen_preset target; /* per-layer shapes of the result: n_embd, n_head, n_head_kv,
                                 head_dim, n_ff_exp, n_ff; n_expert and n_expert_used must equal
                                 the small model's (layers, vocab, rope come from it) */
    enum quant_mix mix;
    uint64_t seed;            /* of the padding noise */
    float noise;              /* padding noise std times sqrt(fan-in); e.g. 1e-3 */
    const char *out_path;     /* temp file + rename */
};

/* Writes the small model grown to the target's shapes with its function kept (up to the
 * noise and the mix's rounding): see tools/gen/inflate.c. stats may be NULL; 0 or -errno. */
int gen_inflate(const struct gen_inflate_config *cfg, struct gen_stats *stats);

#endif

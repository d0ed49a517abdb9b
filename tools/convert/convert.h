/* convert: Hugging Face checkpoint -> GGUF, behind `strata convert`.
 *
 * Input: a directory with config.json (Qwen3MoeForCausalLM, GptOssForCausalLM,
 * Qwen3NextForCausalLM or Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM),
 * safetensors weights (model.safetensors, or shards listed by model.safetensors.index.json) in
 * F32, BF16 or F16, tokenizer.json, and optionally tokenizer_config.json / chat_template.jinja.
 * Output: a qwen3moe, gpt-oss, qwen3next or qwen35moe GGUF with the names, shapes and keys of
 * docs/formats.md §4, §5 and §6.
 *
 * A qwen3next / qwen35moe checkpoint's multi-token-prediction head (mtp.*, one layer) is kept
 * by default as llama.cpp writes it: block num_hidden_layers with its nextn.* tensors,
 * block_count + 1 and nextn_predict_layers 1 (docs/convert-keys.md).
 *
 * Experts are accepted per expert (mlp.experts.E.{gate,up,down}_proj.weight, what transformers
 * 4.x and the released checkpoints store) or fused (mlp.experts.gate_up_proj [E, 2F, H] with
 * the gate rows first, mlp.experts.down_proj [E, H, F], what transformers 5.x keeps in memory
 * and writes with save_original_format=False); each layer may use either.
 *
 * Each output tensor is a list of row segments of source tensors (one for a plain weight, one
 * per expert when stacking, one per expert slice of a fused tensor); rows are converted and
 * quantized with the reference quantizers in parallel (OpenMP) and written in place with
 * gguf_writer_pwrite. Nothing appears at the output path until the file is complete.
 */
#ifndef STRATA_CONVERT_H
#define STRATA_CONVERT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "quant_mix.h"

/* Quant mixes: core/quant_mix.h. */

/* ---- running a conversion ----------------------------------------------------------------- */

enum convert_event_kind {
    CONVERT_EVENT_NOTICE,  /* text: something the user should know (ignored tensors, ...) */
    CONVERT_EVENT_WARNING, /* text: something that may make the file wrong (unknown keys) */
    CONVERT_EVENT_TENSOR,  /* a tensor has been written */
};

struct convert_event {
    enum convert_event_kind kind;
    const char *text; /* NOTICE, WARNING */
    const char *name; /* TENSOR: GGUF name */
    uint32_t type;    /* TENSOR: ggml type written */
    uint32_t n_dims;
    const uint64_t *ne;    /* (n_dims) */
    bool fell_back;        /* the mix's type did not fit the row length */
    uint32_t index, count; /* tensor index (1-based) of count */
    uint64_t done_bytes, total_bytes;
    double seconds; /* since the start */
};

/* Called from the thread that runs convert_run. */
typedef void (*convert_progress_fn)(void *arg, const struct convert_event *ev);

struct convert_config {
    const char *hf_dir;   /* the checkpoint directory */
    const char *out_path; /* written via a temp file and renamed on success */
    enum quant_mix mix;
    uint32_t n_threads;           /* OpenMP threads; 0 = OpenMP's default */
    const char *name;             /* general.name; NULL = the directory's base name */
    bool allow_unknown_keys;      /* a config.json key strata does not know gives a WARNING
                                     event instead of failing with -ENOTSUP */
    bool no_mtp;                  /* qwen3next / qwen35moe: drop the multi-token-prediction
                                     head (mtp.*) instead of writing it as block
                                     num_hidden_layers (nextn) */
    convert_progress_fn progress; /* may be NULL */
    void *progress_arg;
    volatile sig_atomic_t *cancel; /* abort (-EINTR, temp file removed) once *cancel != 0;
                                      may be NULL */
};

struct convert_stats {
    uint32_t n_tensors;  /* tensors written */
    uint64_t n_params;   /* weight elements */
    uint64_t data_bytes; /* bytes of tensor data written */
    uint32_t n_fallback; /* tensors whose mix type fell back */
    uint32_t n_vocab;    /* tokens written (after padding) */
    uint32_t n_unused;   /* checkpoint tensors that were not converted */
    double seconds;
};

/* Converts cfg->hf_dir into cfg->out_path; stats may be NULL. 0 or -errno; on failure nothing
 * is left at out_path and err_msg() names what failed (missing file, unsupported architecture,
 * missing tensor, shape mismatch with both shapes, malformed input, a config.json key whose
 * value strata does not compute: docs/convert-keys.md). */
int convert_run(const struct convert_config *cfg, struct convert_stats *stats);

#endif

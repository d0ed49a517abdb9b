/* hf_ckpt: a Hugging Face checkpoint directory: config.json and its safetensors weights, either
 * one model.safetensors or the shards that model.safetensors.index.json lists. All shards are
 * mapped read-only; the tensors of every shard are looked up by name through one sorted table.
 *
 * Shard names from the index are hostile input too: a name with '/' or a leading '.' (a path
 * outside the directory) is rejected, as is a tensor that two shards hold or that the index
 * places in a shard without it.
 */
#ifndef STRATA_HF_CKPT_H
#define STRATA_HF_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "safetensors.h"

struct json_object;

struct hf_ckpt {
    char *dir;                  /* owned copy */
    struct json_object *config_root; /* config.json, owned (json-c reference) */
    struct json_object *config;      /* what the hf_ckpt_config_* getters read: config_root, or
                                        the member hf_ckpt_config_enter chose (a view) */
    char config_at[64];              /* "" or "KEY.": where config lies, for messages */
    uint32_t n_shards;
    struct safetensors_file **shards; /* (n_shards) owned */
    uint32_t n_tensors;
    const struct safetensors_tensor **tensors; /* (n_tensors) views into shards, by name */
    bool *used;                                /* (n_tensors) set by hf_ckpt_find */
};

/* Opens DIR. 0 or -errno: -ENOENT when config.json or the weights are missing (the message
 * names the path), -EINVAL for malformed JSON or safetensors. */
int hf_ckpt_open(const char *dir, struct hf_ckpt **out);
void hf_ckpt_close(struct hf_ckpt *c);

/* The tensor called NAME in any shard, or NULL; marks it used. */
const struct safetensors_tensor *hf_ckpt_find(struct hf_ckpt *c, const char *name);

/* Where the weights come from, for messages: "model.safetensors" or "N shards". */
const char *hf_ckpt_source(const struct hf_ckpt *c, char *buf, unsigned size);

/* Path DIR/NAME into buf (returns buf, or NULL if it does not fit). */
char *hf_ckpt_path(const struct hf_ckpt *c, const char *name, char *buf, unsigned size);

/* Makes the hf_ckpt_config_* getters read config.json's member KEY (an object, such as the
 * text_config of a vision-language checkpoint) instead of its top level. 0, or -EINVAL naming
 * KEY when it is absent or not an object. */
int hf_ckpt_config_enter(struct hf_ckpt *c, const char *key);

/* config.json members. _u32 / _f64: -ENOENT if absent or null (no message: the caller
 * decides whether that is an error), -EINVAL if the type or range is wrong (named). */
int hf_ckpt_config_u32(const struct hf_ckpt *c, const char *key, uint32_t *out);
int hf_ckpt_config_f64(const struct hf_ckpt *c, const char *key, double *out);
/* A bool member, or def when absent or null. */
bool hf_ckpt_config_bool(const struct hf_ckpt *c, const char *key, bool def);
/* A string member, or NULL. */
const char *hf_ckpt_config_str(const struct hf_ckpt *c, const char *key);
/* Any member, or NULL (json-c view, owned by the checkpoint). */
struct json_object *hf_ckpt_config_get(const struct hf_ckpt *c, const char *key);

#endif

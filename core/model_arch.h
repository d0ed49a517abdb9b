/* model_arch: the loaders of the architectures strata reads, one per GGUF general.architecture:
 * each reads its {arch}.* keys into m->hp and fills m's weights, validating keys, shapes and
 * types (the forwards live in runtime/arch/). */
#ifndef STRATA_MODEL_ARCH_H
#define STRATA_MODEL_ARCH_H

struct model;

struct model_arch {
    const char *name; /* general.architecture */
    int (*load)(struct model *m); /* 0 or -errno, message set */
};

/* The loader of architecture NAME, or NULL. */
const struct model_arch *model_arch_find(const char *name);

int model_qwen3moe_load(struct model *m);

/* ---- checks the loaders share (model.c) ---------------------------------------------------- */

struct weight;

/* Refuses (-EINVAL, naming the tensor and count_key) a tensor blk.N.* with N >= n_layer: a
 * block count that disagrees with the tensors present. Missing layers are found by the loader
 * when it asks for their weights. */
int model_check_blocks(const struct model *m, const char *count_key, uint32_t n_layer);

/* Refuses (-EINVAL, naming the tensor and the element) an F32 weight holding a NaN or an
 * infinity; other types pass unread. Reads the whole tensor: meant for the small ones (norms,
 * routers). */
int model_check_finite(const struct weight *w);

#endif

#include "hf_ckpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "errors.h"

char *hf_ckpt_path(const struct hf_ckpt *c, const char *name, char *buf, unsigned size)
{
    int n = snprintf(buf, size, "%s/%s", c->dir, name);
    return n < 0 || (unsigned)n >= size ? NULL : buf;
}

const char *hf_ckpt_source(const struct hf_ckpt *c, char *buf, unsigned size)
{
    if (c->n_shards == 1)
        snprintf(buf, size, "%s", c->shards[0]->path);
    else
        snprintf(buf, size, "%u shards in %s", c->n_shards, c->dir);
    return buf;
}

static int json_load(const char *path, json_object **out)
{
    if (access(path, R_OK) != 0)
        return err_set(-errno, "%s: %s", path, strerror(errno));
    *out = json_object_from_file(path);
    if (!*out)
        return err_set(-EINVAL, "%s: not valid JSON: %s", path, json_util_get_last_err());
    if (!json_object_is_type(*out, json_type_object)) {
        json_object_put(*out);
        *out = NULL;
        return err_set(-EINVAL, "%s: the top level is not an object", path);
    }
    return 0;
}

static int shard_add(struct hf_ckpt *c, const char *name)
{
    char path[4096];
    struct safetensors_file **s;

    for (uint32_t i = 0; i < c->n_shards; i++) {
        const char *p = strrchr(c->shards[i]->path, '/');
        if (!strcmp(p ? p + 1 : c->shards[i]->path, name))
            return 0;
    }
    if (!name[0] || strchr(name, '/') || name[0] == '.')
        return err_set(-EINVAL,
                       "%s/model.safetensors.index.json: shard name '%s' is not a file "
                       "name inside the directory",
                       c->dir, name);
    if (!hf_ckpt_path(c, name, path, sizeof(path)))
        return err_set(-ENAMETOOLONG, "%s/%s: path too long", c->dir, name);
    s = realloc(c->shards, (c->n_shards + 1) * sizeof(*s));
    if (!s)
        return err_set(-ENOMEM, "out of memory");
    c->shards = s;
    int rc = safetensors_open(path, &c->shards[c->n_shards]);
    if (rc)
        return rc;
    c->n_shards++;
    return 0;
}

static int ptr_cmp(const void *a, const void *b)
{
    return strcmp((*(const struct safetensors_tensor *const *)a)->name,
                  (*(const struct safetensors_tensor *const *)b)->name);
}

/* Builds the merged table; a tensor in two shards is an error. */
static int table_build(struct hf_ckpt *c)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < c->n_shards; i++)
        n += c->shards[i]->n_tensors;
    if (n > UINT32_MAX)
        return err_set(-EINVAL, "%s: %llu tensors", c->dir, (unsigned long long)n);
    c->tensors = malloc((n ? n : 1) * sizeof(*c->tensors));
    c->used = calloc(n ? n : 1, sizeof(*c->used));
    if (!c->tensors || !c->used)
        return err_set(-ENOMEM, "out of memory");
    for (uint32_t i = 0; i < c->n_shards; i++)
        for (uint32_t j = 0; j < c->shards[i]->n_tensors; j++)
            c->tensors[c->n_tensors++] = &c->shards[i]->tensors[j];
    qsort(c->tensors, c->n_tensors, sizeof(*c->tensors), ptr_cmp);
    for (uint32_t i = 1; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i]->name, c->tensors[i - 1]->name))
            return err_set(-EINVAL, "tensor '%s' is in both %s and %s", c->tensors[i]->name,
                           c->tensors[i - 1]->file->path, c->tensors[i]->file->path);
    return 0;
}

/* Opens the shards of model.safetensors.index.json and checks its weight_map. */
static int index_open(struct hf_ckpt *c, const char *index_path)
{
    json_object *idx, *map;
    int rc = json_load(index_path, &idx);

    if (rc)
        return rc;
    if (!json_object_object_get_ex(idx, "weight_map", &map) ||
        !json_object_is_type(map, json_type_object)) {
        json_object_put(idx);
        return err_set(-EINVAL, "%s: no weight_map object", index_path);
    }
    json_object_object_foreach(map, name, shard)
    {
        if (!json_object_is_type(shard, json_type_string)) {
            rc = err_set(-EINVAL, "%s: weight_map['%s'] is not a string", index_path, name);
            break;
        }
        rc = shard_add(c, json_object_get_string(shard));
        if (rc)
            break;
    }
    if (!rc && c->n_shards == 0)
        rc = err_set(-EINVAL, "%s: the weight_map is empty", index_path);
    if (!rc)
        rc = table_build(c);
    if (!rc) {
        json_object_object_foreach(map, name2, shard2)
        {
            const struct safetensors_tensor *t = NULL;
            for (uint32_t i = 0; i < c->n_shards && !t; i++)
                t = safetensors_find(c->shards[i], name2);
            const char *want = json_object_get_string(shard2);
            const char *got = t ? strrchr(t->file->path, '/') + 1 : NULL;
            if (!t || strcmp(got, want)) {
                rc = err_set(-EINVAL, "%s: weight_map puts '%s' in %s, %s%s", index_path, name2,
                             want, t ? "but it is in " : "which does not hold it", t ? got : "");
                break;
            }
        }
    }
    json_object_put(idx);
    return rc;
}

int hf_ckpt_open(const char *dir, struct hf_ckpt **out)
{
    struct hf_ckpt *c = calloc(1, sizeof(*c));
    char path[4096];
    int rc;

    *out = NULL;
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return err_set(-ENOMEM, "out of memory");
    }
    size_t len = strlen(c->dir);
    while (len > 1 && c->dir[len - 1] == '/')
        c->dir[--len] = '\0';
    if (!hf_ckpt_path(c, "config.json", path, sizeof(path))) {
        rc = err_set(-ENAMETOOLONG, "%s: path too long", dir);
        goto out_close;
    }
    rc = json_load(path, &c->config_root);
    if (rc)
        goto out_close;
    c->config = c->config_root;
    hf_ckpt_path(c, "model.safetensors.index.json", path, sizeof(path));
    if (access(path, F_OK) == 0) {
        rc = index_open(c, path);
    } else {
        hf_ckpt_path(c, "model.safetensors", path, sizeof(path));
        if (access(path, F_OK) != 0) {
            rc = err_set(-ENOENT, "%s: no model.safetensors or model.safetensors.index.json",
                         c->dir);
            goto out_close;
        }
        rc = shard_add(c, "model.safetensors");
        rc = rc ? rc : table_build(c);
    }
    if (rc)
        goto out_close;
    *out = c;
    return 0;

out_close:
    hf_ckpt_close(c);
    return rc;
}

void hf_ckpt_close(struct hf_ckpt *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_shards; i++)
        safetensors_close(c->shards[i]);
    free(c->shards);
    free(c->tensors);
    free(c->used);
    if (c->config_root)
        json_object_put(c->config_root);
    free(c->dir);
    free(c);
}

const struct safetensors_tensor *hf_ckpt_find(struct hf_ckpt *c, const char *name)
{
    struct safetensors_tensor key = {.name = (char *)name};
    const struct safetensors_tensor *kp = &key;
    const struct safetensors_tensor **hit =
        bsearch(&kp, c->tensors, c->n_tensors, sizeof(*c->tensors), ptr_cmp);
    if (!hit)
        return NULL;
    c->used[hit - c->tensors] = true;
    return *hit;
}

int hf_ckpt_config_enter(struct hf_ckpt *c, const char *key)
{
    json_object *v = NULL;

    if (!json_object_object_get_ex(c->config_root, key, &v) ||
        !json_object_is_type(v, json_type_object))
        return err_set(-EINVAL, "%s/config.json: %s is %s, expected an object", c->dir, key,
                       v ? json_object_to_json_string(v) : "absent");
    snprintf(c->config_at, sizeof(c->config_at), "%s.", key);
    c->config = v;
    return 0;
}

json_object *hf_ckpt_config_get(const struct hf_ckpt *c, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(c->config, key, &v) || json_object_is_type(v, json_type_null))
        return NULL;
    return v;
}

int hf_ckpt_config_u32(const struct hf_ckpt *c, const char *key, uint32_t *out)
{
    json_object *v = hf_ckpt_config_get(c, key);
    if (!v)
        return -ENOENT;
    int64_t x = json_object_get_int64(v);
    if (!json_object_is_type(v, json_type_int) || x < 0 || x > UINT32_MAX)
        return err_set(-EINVAL, "%s/config.json: %s%s is %s, expected an integer in [0, %u]",
                       c->dir, c->config_at, key, json_object_to_json_string(v), UINT32_MAX);
    *out = (uint32_t)x;
    return 0;
}

int hf_ckpt_config_f64(const struct hf_ckpt *c, const char *key, double *out)
{
    json_object *v = hf_ckpt_config_get(c, key);
    if (!v)
        return -ENOENT;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return err_set(-EINVAL, "%s/config.json: %s%s is %s, expected a number", c->dir,
                       c->config_at, key, json_object_to_json_string(v));
    *out = json_object_get_double(v);
    if (!isfinite(*out))
        return err_set(-EINVAL, "%s/config.json: %s%s is not finite", c->dir, c->config_at, key);
    return 0;
}

bool hf_ckpt_config_bool(const struct hf_ckpt *c, const char *key, bool def)
{
    json_object *v = hf_ckpt_config_get(c, key);
    return v ? json_object_get_boolean(v) : def;
}

const char *hf_ckpt_config_str(const struct hf_ckpt *c, const char *key)
{
    json_object *v = hf_ckpt_config_get(c, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

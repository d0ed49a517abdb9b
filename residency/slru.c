#include "slru.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Pinned slots (a frozen profile) sit in a list of their own: the segments, their cap and the
 * victim search only ever see the slots the policy may move, whatever the number pinned. */
enum slru_seg { SEG_FREE = 0, SEG_PROB, SEG_PROT, SEG_PIN };

struct slru_slot {
    int32_t layer, expert; /* -1 when free */
    int32_t prev, next;    /* links in its segment list (toward MRU / toward LRU), -1 ends */
    uint8_t seg;           /* enum slru_seg */
    bool pinned;
    bool retired;          /* out of the pool for good */
    uint64_t used;         /* step in which it was last looked up or admitted */
};

struct slru_list {
    int32_t head, tail; /* head = most recent, tail = least recent */
    int32_t n;
};

struct slru {
    struct slru_config cfg;
    int prot_cap;                   /* most slots the protected segment holds */
    int fair;                       /* n_slots / n_layer, at least 1 */
    struct slru_slot *slots;        /* (n_slots) */
    int32_t *map;                   /* (n_layer * n_expert) slot of a key, or -1 */
    int32_t *free_stack;            /* (n_slots) free slot indices */
    int n_free;
    int32_t *held;                  /* (n_layer) slots held per layer */
    int32_t *pinned;                /* (n_layer) of those, pinned */
    struct slru_layer_stats *stats; /* (n_layer) */
    struct slru_list prob, prot, pin;
    uint64_t step;                  /* current step, starts at 1 */
    int n_retired;
    uint16_t *freq;                 /* (n_layer * n_expert) decayed count of steps using a key */
    uint64_t *counted;              /* (n_layer * n_expert) step of the key's last count */
    uint64_t *layer_step;           /* (n_layer) step of the layer's last lookup */
    int32_t *layer_age;             /* (n_layer) steps of the layer since its counts halved */
};

/* Steps of a layer after which its use counts halve: long enough to rank a layer's experts by
 * how often a step needs them, short enough to follow a change of text within a few hundred
 * tokens. */
#define SLRU_FREQ_WINDOW 64

static struct slru_list *slru_list_of(struct slru *c, int seg)
{
    return seg == SEG_PROT ? &c->prot : seg == SEG_PIN ? &c->pin : &c->prob;
}

static void slru_unlink(struct slru *c, int s)
{
    struct slru_slot *x = &c->slots[s];
    struct slru_list *l = slru_list_of(c, x->seg);
    if (x->prev >= 0)
        c->slots[x->prev].next = x->next;
    else
        l->head = x->next;
    if (x->next >= 0)
        c->slots[x->next].prev = x->prev;
    else
        l->tail = x->prev;
    x->prev = x->next = -1;
    l->n--;
}

static void slru_push_head(struct slru *c, int s, int seg)
{
    struct slru_slot *x = &c->slots[s];
    struct slru_list *l = slru_list_of(c, seg);
    x->seg = (uint8_t)seg;
    x->prev = -1;
    x->next = l->head;
    if (l->head >= 0)
        c->slots[l->head].prev = s;
    else
        l->tail = s;
    l->head = s;
    l->n++;
}

/* The protected cap and the fair share of a pool of n live slots: both of the slots not
 * pinned (a layer's frozen experts do not count against its share of the rest). */
static void slru_size_caps(struct slru *c, int n)
{
    int free_n = n - c->pin.n;
    c->prot_cap = free_n * (c->cfg.protected_pct ? c->cfg.protected_pct : 50) / 100;
    c->fair = free_n / c->cfg.n_layer > 0 ? free_n / c->cfg.n_layer : 1;
}

/* Slots of layer l the policy may move (held, not pinned). */
static int slru_movable(const struct slru *c, int l)
{
    return c->held[l] - c->pinned[l];
}

int slru_open(const struct slru_config *cfg, struct slru **out)
{
    struct slru *c;
    size_t keys;

    if (!cfg || cfg->n_layer < 1 || cfg->n_expert < 1 || cfg->n_slots < 1 ||
        cfg->protected_pct < 0 || cfg->protected_pct > 100)
        return -EINVAL;
    keys = (size_t)cfg->n_layer * (size_t)cfg->n_expert;
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->cfg = *cfg;
    c->pin = (struct slru_list){.head = -1, .tail = -1, .n = 0};
    slru_size_caps(c, cfg->n_slots);
    c->slots = calloc((size_t)cfg->n_slots, sizeof(*c->slots));
    c->map = malloc(keys * sizeof(*c->map));
    c->free_stack = malloc((size_t)cfg->n_slots * sizeof(*c->free_stack));
    c->held = calloc((size_t)cfg->n_layer, sizeof(*c->held));
    c->pinned = calloc((size_t)cfg->n_layer, sizeof(*c->pinned));
    c->stats = calloc((size_t)cfg->n_layer, sizeof(*c->stats));
    c->freq = calloc(keys, sizeof(*c->freq));
    c->counted = calloc(keys, sizeof(*c->counted));
    c->layer_step = calloc((size_t)cfg->n_layer, sizeof(*c->layer_step));
    c->layer_age = calloc((size_t)cfg->n_layer, sizeof(*c->layer_age));
    if (!c->slots || !c->map || !c->free_stack || !c->held || !c->pinned || !c->stats ||
        !c->freq || !c->counted || !c->layer_step || !c->layer_age) {
        slru_close(c);
        return -ENOMEM;
    }
    for (size_t k = 0; k < keys; k++)
        c->map[k] = -1;
    for (int s = 0; s < cfg->n_slots; s++) {
        c->slots[s] = (struct slru_slot){.layer = -1, .expert = -1, .prev = -1, .next = -1};
        c->free_stack[c->n_free++] = cfg->n_slots - 1 - s; /* slot 0 is handed out first */
    }
    c->prob = c->prot = (struct slru_list){.head = -1, .tail = -1, .n = 0};
    c->step = 1;
    *out = c;
    return 0;
}

void slru_close(struct slru *c)
{
    if (!c)
        return;
    free(c->slots);
    free(c->map);
    free(c->free_stack);
    free(c->held);
    free(c->pinned);
    free(c->stats);
    free(c->freq);
    free(c->counted);
    free(c->layer_step);
    free(c->layer_age);
    free(c);
}

static bool slru_key_ok(const struct slru *c, int layer, int expert)
{
    return layer >= 0 && layer < c->cfg.n_layer && expert >= 0 && expert < c->cfg.n_expert;
}

int slru_peek(const struct slru *c, int layer, int expert)
{
    if (!slru_key_ok(c, layer, expert))
        return -1;
    return c->map[(size_t)layer * c->cfg.n_expert + expert];
}

/* Moves a protected-segment overflow back to probation (its most recent end). */
static void slru_demote_overflow(struct slru *c)
{
    while (c->prot.n > c->prot_cap) {
        int s = c->prot.tail;
        while (s >= 0 && c->slots[s].pinned)
            s = c->slots[s].prev;
        if (s < 0)
            return; /* only pinned slots are protected: they may exceed the cap */
        slru_unlink(c, s);
        slru_push_head(c, s, SEG_PROB);
    }
}

void slru_step(struct slru *c)
{
    c->step++;
}

/* Counts a step's use of (layer, expert), once per step; every window steps of the layer its
 * counts halve. */
static void slru_count(struct slru *c, int layer, int expert)
{
    size_t key = (size_t)layer * c->cfg.n_expert + expert;
    if (c->layer_step[layer] != c->step) {
        c->layer_step[layer] = c->step;
        if (++c->layer_age[layer] >= SLRU_FREQ_WINDOW) {
            c->layer_age[layer] = 0;
            for (int e = 0; e < c->cfg.n_expert; e++)
                c->freq[(size_t)layer * c->cfg.n_expert + e] >>= 1;
        }
    }
    if (c->counted[key] != c->step && c->freq[key] < UINT16_MAX) {
        c->counted[key] = c->step;
        c->freq[key]++;
    }
}

static unsigned slru_freq(const struct slru *c, int layer, int expert)
{
    return c->freq[(size_t)layer * c->cfg.n_expert + expert];
}

int slru_lookup(struct slru *c, int layer, int expert)
{
    int s = slru_peek(c, layer, expert);
    if (!slru_key_ok(c, layer, expert))
        return -1;
    slru_count(c, layer, expert);
    if (s < 0) {
        c->stats[layer].misses++;
        return -1;
    }
    c->stats[layer].hits++;
    c->slots[s].used = c->step;
    if (c->slots[s].pinned)
        return s;
    if (c->slots[s].seg == SEG_PROB)
        c->stats[layer].promotions++;
    slru_unlink(c, s);
    slru_push_head(c, s, SEG_PROT);
    slru_demote_overflow(c);
    return s;
}

/* The next layer after the guard is off limits; so is anything in use this step. */
static bool slru_guarded(const struct slru *c, const struct slru_slot *x, int guard)
{
    return x->used == c->step || (guard >= 0 && x->layer == (guard + 1) % c->cfg.n_layer);
}

/* The least recent slot of list l that is evictable for an admission into `layer` of an
 * expert used in `freq` steps: never a slot of `layer` used more often.
 * fairness: 1 = only layers above their share, 2 = only `layer` itself, 0 = any. */
static int slru_victim_in(const struct slru *c, const struct slru_list *l, int layer, int guard,
                          unsigned freq, int fairness)
{
    for (int s = l->tail; s >= 0; s = c->slots[s].prev) {
        const struct slru_slot *x = &c->slots[s];
        if (x->pinned || slru_guarded(c, x, guard))
            continue;
        if (fairness == 1 && slru_movable(c, x->layer) <= c->fair)
            continue;
        if (fairness == 2 && x->layer != layer)
            continue;
        if (x->layer == layer && slru_freq(c, layer, x->expert) > freq)
            continue;
        return s;
    }
    return -1;
}

static int slru_victim(const struct slru *c, int layer, int expert, int guard)
{
    unsigned f = slru_freq(c, layer, expert);
    int s;
    if (slru_movable(c, layer) >= c->fair) { /* at its share: only its own slots */
        s = slru_victim_in(c, &c->prob, layer, guard, f, 2);
        return s >= 0 ? s : slru_victim_in(c, &c->prot, layer, guard, f, 2);
    }
    s = slru_victim_in(c, &c->prob, layer, guard, f, 1);
    if (s < 0)
        s = slru_victim_in(c, &c->prot, layer, guard, f, 1);
    if (s < 0) /* nobody to take from fairly: the least recent evictable slot of all */
        s = slru_victim_in(c, &c->prob, layer, guard, f, 0);
    if (s < 0)
        s = slru_victim_in(c, &c->prot, layer, guard, f, 0);
    return s;
}

int slru_admit(struct slru *c, int layer, int expert, int guard, int *ev_layer, int *ev_expert)
{
    int s;

    *ev_layer = *ev_expert = -1;
    if (!slru_key_ok(c, layer, expert))
        return -EINVAL;
    if (slru_peek(c, layer, expert) >= 0)
        return -EEXIST;
    if (c->n_free > 0) {
        s = c->free_stack[--c->n_free];
    } else {
        s = slru_victim(c, layer, expert, guard);
        if (s < 0) {
            c->stats[layer].bypassed++;
            return -ENOSPC;
        }
        struct slru_slot *v = &c->slots[s];
        *ev_layer = v->layer;
        *ev_expert = v->expert;
        c->stats[v->layer].evictions++;
        c->held[v->layer]--;
        c->map[(size_t)v->layer * c->cfg.n_expert + v->expert] = -1;
        slru_unlink(c, s);
    }
    c->slots[s].layer = layer;
    c->slots[s].expert = expert;
    c->slots[s].pinned = false;
    c->slots[s].used = c->step;
    c->map[(size_t)layer * c->cfg.n_expert + expert] = s;
    c->held[layer]++;
    c->stats[layer].admissions++;
    slru_push_head(c, s, SEG_PROB);
    return s;
}

int slru_pin(struct slru *c, int layer, int expert)
{
    int s = slru_peek(c, layer, expert);
    if (s < 0)
        return -ENOENT;
    if (c->slots[s].pinned)
        return 0;
    slru_unlink(c, s);
    c->slots[s].pinned = true;
    c->pinned[layer]++;
    slru_push_head(c, s, SEG_PIN);
    slru_size_caps(c, c->cfg.n_slots - c->n_retired);
    slru_demote_overflow(c);
    return 0;
}

int slru_retire(struct slru *c, int slot, int *ev_layer, int *ev_expert)
{
    *ev_layer = *ev_expert = -1;
    if (slot < 0 || slot >= c->cfg.n_slots)
        return -EINVAL;
    struct slru_slot *x = &c->slots[slot];
    if (x->retired)
        return -EALREADY;
    if (x->layer < 0) {
        for (int i = 0; i < c->n_free; i++) {
            if (c->free_stack[i] == slot) {
                c->free_stack[i] = c->free_stack[--c->n_free];
                break;
            }
        }
    } else {
        *ev_layer = x->layer;
        *ev_expert = x->expert;
        c->stats[x->layer].evictions++;
        c->held[x->layer]--;
        c->pinned[x->layer] -= x->pinned;
        c->map[(size_t)x->layer * c->cfg.n_expert + x->expert] = -1;
        slru_unlink(c, slot);
        x->layer = x->expert = -1;
        x->pinned = false;
        x->seg = SEG_FREE;
    }
    x->retired = true;
    c->n_retired++;
    slru_size_caps(c, c->cfg.n_slots - c->n_retired);
    slru_demote_overflow(c);
    return 0;
}

void slru_clear(struct slru *c)
{
    const size_t keys = (size_t)c->cfg.n_layer * (size_t)c->cfg.n_expert;
    for (size_t k = 0; k < keys; k++)
        c->map[k] = -1;
    memset(c->held, 0, sizeof(*c->held) * (size_t)c->cfg.n_layer);
    memset(c->pinned, 0, sizeof(*c->pinned) * (size_t)c->cfg.n_layer);
    c->prob = c->prot = c->pin = (struct slru_list){.head = -1, .tail = -1, .n = 0};
    c->n_free = 0;
    for (int s = c->cfg.n_slots - 1; s >= 0; s--) { /* slot 0 is handed out first */
        struct slru_slot *x = &c->slots[s];
        bool retired = x->retired;
        *x = (struct slru_slot){
            .layer = -1, .expert = -1, .prev = -1, .next = -1, .retired = retired};
        if (!retired)
            c->free_stack[c->n_free++] = s;
    }
    slru_size_caps(c, c->cfg.n_slots - c->n_retired);
}

int slru_place(struct slru *c, int slot, int layer, int expert)
{
    if (!slru_key_ok(c, layer, expert) || slot < 0 || slot >= c->cfg.n_slots)
        return -EINVAL;
    if (slru_peek(c, layer, expert) >= 0)
        return -EEXIST;
    int i = 0;
    while (i < c->n_free && c->free_stack[i] != slot)
        i++;
    if (i == c->n_free)
        return -EBUSY; /* held, or retired */
    c->free_stack[i] = c->free_stack[--c->n_free];
    struct slru_slot *x = &c->slots[slot];
    x->layer = layer;
    x->expert = expert;
    x->pinned = false;
    x->used = 0; /* not in use in the current step */
    c->map[(size_t)layer * c->cfg.n_expert + expert] = slot;
    c->held[layer]++;
    slru_push_head(c, slot, SEG_PROB);
    return 0;
}

int slru_live_slots(const struct slru *c)
{
    return c->cfg.n_slots - c->n_retired;
}

bool slru_slot_pinned(const struct slru *c, int slot)
{
    return slot >= 0 && slot < c->cfg.n_slots && c->slots[slot].pinned;
}

bool slru_slot_retired(const struct slru *c, int slot)
{
    return slot >= 0 && slot < c->cfg.n_slots && c->slots[slot].retired;
}

int slru_slot_key(const struct slru *c, int slot, int *layer, int *expert)
{
    if (slot < 0 || slot >= c->cfg.n_slots || c->slots[slot].layer < 0)
        return -ENOENT;
    *layer = c->slots[slot].layer;
    *expert = c->slots[slot].expert;
    return 0;
}

void slru_reset_stats(struct slru *c)
{
    memset(c->stats, 0, sizeof(*c->stats) * (size_t)c->cfg.n_layer);
}

const struct slru_layer_stats *slru_stats(const struct slru *c, int layer)
{
    return layer >= 0 && layer < c->cfg.n_layer ? &c->stats[layer] : NULL;
}

int slru_layer_held(const struct slru *c, int layer)
{
    return layer >= 0 && layer < c->cfg.n_layer ? c->held[layer] : 0;
}

/* Walks one list checking links, segment tags and map entries; returns its length or -1. */
static int slru_check_list(const struct slru *c, const struct slru_list *l, int seg)
{
    int n = 0, prev = -1;
    for (int s = l->head; s >= 0; prev = s, s = c->slots[s].next) {
        const struct slru_slot *x = &c->slots[s];
        if (n++ > c->cfg.n_slots || x->seg != seg || x->prev != prev || x->layer < 0 ||
            c->map[(size_t)x->layer * c->cfg.n_expert + x->expert] != s)
            return -1;
    }
    return prev == l->tail && n == l->n ? n : -1;
}

int slru_check(const struct slru *c)
{
    int prob = slru_check_list(c, &c->prob, SEG_PROB);
    int prot = slru_check_list(c, &c->prot, SEG_PROT);
    int pin = slru_check_list(c, &c->pin, SEG_PIN);
    int pinned = 0, held = 0, mapped = 0;

    if (prob < 0 || prot < 0 || pin < 0 ||
        prob + prot + pin + c->n_free + c->n_retired != c->cfg.n_slots)
        return -EFAULT;
    for (int i = 0; i < c->n_free; i++)
        if (c->slots[c->free_stack[i]].retired)
            return -EFAULT;
    for (int s = 0; s < c->cfg.n_slots; s++)
        pinned += c->slots[s].pinned;
    for (int l = 0; l < c->cfg.n_layer; l++)
        pinned -= c->pinned[l];
    if (prot > c->prot_cap || pinned != 0 || c->pin.n != pin)
        return -EFAULT;
    for (int l = 0; l < c->cfg.n_layer; l++)
        held += c->held[l];
    for (size_t k = 0; k < (size_t)c->cfg.n_layer * c->cfg.n_expert; k++)
        mapped += c->map[k] >= 0;
    return held == prob + prot + pin && mapped == held ? 0 : -EFAULT;
}

#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

enum chat_format chat_format_of_arch(const char *arch)
{
    if (arch && !strcmp(arch, "gpt-oss"))
        return CHAT_FORMAT_HARMONY;
    if (arch && !strcmp(arch, "qwen35moe"))
        return CHAT_FORMAT_QWEN35;
    return CHAT_FORMAT_CHATML;
}

#define HARMONY_IDENTITY "You are ChatGPT, a large language model trained by OpenAI."
#define HARMONY_CUTOFF "2024-06"
#define HARMONY_CHANNELS                                                                           \
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."

static size_t chat_cap(const struct chat_msg *msgs, int n)
{
    size_t cap = 512 + sizeof(HARMONY_IDENTITY) + sizeof(HARMONY_CHANNELS);
    for (int i = 0; i < n; i++)
        cap += strlen(msgs[i].role) + strlen(msgs[i].content) + 64;
    return cap;
}

static char *render_harmony(const struct chat_style *st, const struct chat_msg *msgs, int n,
                            bool add_assistant, char *p)
{
    if (st->start) {
        p += sprintf(p, "<|start|>system<|message|>" HARMONY_IDENTITY
                        "\nKnowledge cutoff: " HARMONY_CUTOFF "\n");
        if (st->date)
            p += sprintf(p, "Current date: %.32s\n", st->date);
        p += sprintf(p, "\nReasoning: %s\n\n" HARMONY_CHANNELS "<|end|>",
                     st->think ? "medium" : "low");
    }
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content;
        if (!strcmp(r, "system") || !strcmp(r, "developer"))
            p += sprintf(p, "<|start|>developer<|message|># Instructions\n\n%s<|end|>", c);
        else if (!strcmp(r, "assistant"))
            p += sprintf(p, "<|start|>assistant<|channel|>final<|message|>%s<|end|>", c);
        else
            p += sprintf(p, "<|start|>%s<|message|>%s<|end|>", r, c);
    }
    if (add_assistant)
        p += sprintf(p, "<|start|>assistant");
    return p;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Appends s[0..n) without the whitespace at its end and, if lead, at its start. */
static char *put_trimmed(char *p, const char *s, size_t n, bool lead)
{
    while (lead && n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    memcpy(p, s, n);
    return p + n;
}

static char *render_qwen35(const struct chat_style *st, const struct chat_msg *msgs, int n,
                           bool add_assistant, char *p)
{
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content, *end = c + strlen(c);
        bool lead = true;
        if (!strcmp(r, "assistant")) {
            /* the reply without its reasoning: after the last </think>, leading newlines off */
            for (const char *t = strstr(c, "</think>"); t; t = strstr(t + 1, "</think>"))
                c = t + strlen("</think>"), lead = false;
            while (!lead && *c == '\n')
                c++;
        }
        p += sprintf(p, "<|im_start|>%s\n", r);
        p = put_trimmed(p, c, (size_t)(end - c), lead);
        p += sprintf(p, "<|im_end|>\n");
    }
    if (add_assistant)
        p += sprintf(p, "<|im_start|>assistant\n%s",
                     st->think ? "<think>\n" : "<think>\n\n</think>\n\n");
    return p;
}

/* Qwen3.5's template refuses a system message after the first and a conversation without a
 * user message. */
static int check_qwen35(const struct chat_msg *msgs, int n)
{
    bool user = false;
    for (int i = 0; i < n; i++) {
        if (!strcmp(msgs[i].role, "system") && i > 0)
            return err_set(-EINVAL, "Qwen3.5 chat format: a system message must come first");
        user |= !strcmp(msgs[i].role, "user");
    }
    return user ? 0 : err_set(-EINVAL, "Qwen3.5 chat format: no user message");
}

int chat_render(const struct chat_style *st, const struct chat_msg *msgs, int n, bool add_assistant,
                char **out)
{
    if (st->format == CHAT_FORMAT_QWEN35) {
        int rc = check_qwen35(msgs, n);
        if (rc)
            return rc;
    }
    char *buf = malloc(chat_cap(msgs, n)), *p;

    if (!buf)
        return err_set(-ENOMEM, "out of memory");
    p = buf;
    if (st->format == CHAT_FORMAT_HARMONY) {
        p = render_harmony(st, msgs, n, add_assistant, p);
    } else if (st->format == CHAT_FORMAT_QWEN35) {
        p = render_qwen35(st, msgs, n, add_assistant, p);
    } else {
        for (int i = 0; i < n; i++)
            p += sprintf(p, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
        if (add_assistant)
            p +=
                sprintf(p, "<|im_start|>assistant\n%s", st->think ? "" : "<think>\n\n</think>\n\n");
    }
    *p = '\0';
    *out = buf;
    return 0;
}

int chat_render_chatml(const struct chat_msg *msgs, int n, bool add_assistant, bool think,
                       char **out)
{
    struct chat_style st = {.format = CHAT_FORMAT_CHATML, .think = think};
    return chat_render(&st, msgs, n, add_assistant, out);
}

const char *const *chat_stops(enum chat_format f)
{
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const harmony[] = {"<|return|>", "<|call|>", NULL};
    return f == CHAT_FORMAT_HARMONY ? harmony : chatml;
}

/* ---- harmony replies ------------------------------------------------------------------------ */

enum { H_HEADER, H_BODY };

static const char *const h_markers[] = {"<|start|>",  "<|channel|>", "<|message|>",  "<|end|>",
                                        "<|return|>", "<|call|>",    "<|constrain|>"};
#define H_N_MARKERS (sizeof(h_markers) / sizeof(h_markers[0]))

void chat_harmony_init(struct chat_harmony *h,
                       void (*emit)(void *ctx, const char *channel, const char *text, size_t len),
                       void *ctx)
{
    memset(h, 0, sizeof(*h));
    h->emit = emit;
    h->ctx = ctx;
    h->state = H_HEADER;
}

void chat_harmony_free(struct chat_harmony *h)
{
    free(h->final);
    h->final = NULL;
    h->final_len = h->final_cap = 0;
}

static void h_header_add(struct chat_harmony *h, const char *s, size_t n)
{
    size_t room = sizeof(h->header) - 1 - h->n_header;
    n = n < room ? n : room;
    memcpy(h->header + h->n_header, s, n);
    h->n_header += n;
    h->header[h->n_header] = '\0';
}

/* Message text: to emit, and to the final buffer on the final channel. */
static int h_text(struct chat_harmony *h, const char *s, size_t n)
{
    if (!n)
        return 0;
    if (h->state == H_HEADER) {
        h_header_add(h, s, n);
        return 0;
    }
    if (!strcmp(h->channel, "final")) {
        if (h->final_len + n + 1 > h->final_cap) {
            size_t cap = (h->final_len + n + 1) * 2;
            char *p = realloc(h->final, cap);
            if (!p)
                return err_set(-ENOMEM, "out of memory");
            h->final = p;
            h->final_cap = cap;
        }
        memcpy(h->final + h->final_len, s, n);
        h->final_len += n;
        h->final[h->final_len] = '\0';
    }
    if (h->emit)
        h->emit(h->ctx, h->channel, s, n);
    return 0;
}

/* The channel named in the header ("<|channel|>NAME", up to a space or marker); "final" when
 * the message names none. */
static void h_channel(struct chat_harmony *h)
{
    const char *p = strstr(h->header, "<|channel|>");
    size_t n = 0;
    if (p) {
        p += strlen("<|channel|>");
        n = strcspn(p, " <");
    }
    if (!n)
        p = "final", n = 5;
    n = n < sizeof(h->channel) - 1 ? n : sizeof(h->channel) - 1;
    memcpy(h->channel, p, n);
    h->channel[n] = '\0';
}

static void h_marker(struct chat_harmony *h, const char *m)
{
    if (h->state == H_HEADER) {
        if (!strcmp(m, "<|message|>")) {
            h_channel(h);
            h->state = H_BODY;
            h->n_header = 0;
            h->header[0] = '\0';
        } else if (!strcmp(m, "<|start|>")) {
            h->n_header = 0;
            h->header[0] = '\0';
        } else {
            h_header_add(h, m, strlen(m));
        }
        return;
    }
    if (!strcmp(m, "<|end|>") || !strcmp(m, "<|return|>") || !strcmp(m, "<|call|>")) {
        h->state = H_HEADER;
        h->done |= strcmp(m, "<|end|>") != 0;
    }
    /* other markers inside a message body are dropped */
}

int chat_harmony_feed(struct chat_harmony *h, const char *text, size_t len)
{
    size_t run0 = 0; /* start of the plain text not yet passed on */
    for (size_t i = 0; i < len; i++) {
        if (!h->n_pending && text[i] != '<')
            continue;
        int rc = h_text(h, text + run0, i - run0);
        if (rc)
            return rc;
        run0 = i + 1;
        h->pending[h->n_pending++] = text[i];
        /* resolve the pending bytes: a marker, a prefix of one, or plain text */
        while (h->n_pending) {
            bool prefix = false;
            const char *hit = NULL;
            for (size_t k = 0; k < H_N_MARKERS; k++) {
                size_t ml = strlen(h_markers[k]);
                if (h->n_pending <= ml && !memcmp(h_markers[k], h->pending, h->n_pending)) {
                    prefix = true;
                    if (h->n_pending == ml)
                        hit = h_markers[k];
                }
            }
            if (hit) {
                h->n_pending = 0;
                h_marker(h, hit);
            } else if (!prefix) {
                /* the first byte is text; the rest may still start a marker */
                size_t rest = 1;
                while (rest < h->n_pending && h->pending[rest] != '<')
                    rest++;
                if ((rc = h_text(h, h->pending, rest)))
                    return rc;
                memmove(h->pending, h->pending + rest, h->n_pending - rest);
                h->n_pending -= rest;
                continue;
            }
            break;
        }
    }
    return h_text(h, text + run0, len - run0);
}

void chat_harmony_flush(struct chat_harmony *h)
{
    size_t n = h->n_pending;
    h->n_pending = 0;
    h_text(h, h->pending, n);
}

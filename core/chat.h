/* chat: the conversation formats of the architectures strata runs.
 *
 *   ChatML (the Qwen family):  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 *     With thinking disabled, Qwen3's template pre-fills an empty <think></think> block.
 *   Qwen3.5 (qwen35moe): ChatML as its released template renders a text conversation: the
 *     system message only first, every content trimmed, an earlier assistant reply without
 *     its reasoning (the text up to </think> and the newlines after it dropped), and the
 *     assistant's turn opened with "<think>\n" (thinking) or "<think>\n\n</think>\n\n".
 *   harmony (gpt-oss):         <|start|>ROLE<|message|>CONTENT<|end|> ... <|start|>assistant
 *     A conversation opens with the system header (identity, knowledge cutoff, the date,
 *     "Reasoning: medium" or "low" without thinking, the valid channels); a system message
 *     becomes the developer message "# Instructions\n\n..."; an earlier assistant reply is
 *     rendered on its final channel. The model answers on channels:
 *       <|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final
 *       <|message|>ANSWER<|return|>
 *     which struct chat_harmony splits as the text streams in. */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

struct chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
};

enum chat_format {
    CHAT_FORMAT_CHATML = 0,
    CHAT_FORMAT_HARMONY = 1,
    CHAT_FORMAT_QWEN35 = 2,
};

/* The format of architecture ARCH (general.architecture): harmony for gpt-oss, Qwen3.5's for
 * qwen35moe, else ChatML. */
enum chat_format chat_format_of_arch(const char *arch);

struct chat_style {
    enum chat_format format;
    bool think;       /* ChatML: no empty think block; harmony: "Reasoning: medium" (else low) */
    bool start;       /* harmony: the messages open the conversation (the system header first) */
    const char *date; /* harmony: "Current date: DATE" in the header; NULL leaves it out */
};

/* Renders msgs[0..n) and, if add_assistant, the opening of the assistant's turn. *out is
 * malloc'd and NUL-terminated. 0, -ENOMEM, or -EINVAL for a conversation the format's template
 * refuses (Qwen3.5: a system message after the first, no user message). */
int chat_render(const struct chat_style *st, const struct chat_msg *msgs, int n, bool add_assistant,
                char **out);

/* ChatML rendering (chat_render with CHAT_FORMAT_CHATML). */
int chat_render_chatml(const struct chat_msg *msgs, int n, bool add_assistant, bool think,
                       char **out);

/* The texts that end the assistant's turn in format f (stop strings for generation), NULL
 * terminated. */
const char *const *chat_stops(enum chat_format f);

/* A harmony reply split into channels as its text streams in (after the rendered
 * "<|start|>assistant"). emit receives message text with its channel ("final", "analysis",
 * "commentary", ...); headers and markers are not passed on. The final channel's text is also
 * kept (final, final_len) for the next turn's history. */
struct chat_harmony {
    void (*emit)(void *ctx, const char *channel, const char *text, size_t len);
    void *ctx;
    int state;        /* internal */
    char pending[64]; /* internal: a possible marker split across pieces */
    size_t n_pending;
    char header[128]; /* internal: the current message's header */
    size_t n_header;
    char channel[32];
    char *final; /* malloc'd, NUL-terminated; NULL until final text arrives */
    size_t final_len, final_cap;
    bool done; /* <|return|> or <|call|> seen */
};

void chat_harmony_init(struct chat_harmony *h,
                       void (*emit)(void *ctx, const char *channel, const char *text, size_t len),
                       void *ctx);
/* Feeds len bytes of generated text. 0 or -ENOMEM. */
int chat_harmony_feed(struct chat_harmony *h, const char *text, size_t len);
/* Passes on text held back as a possible marker (the reply has ended). */
void chat_harmony_flush(struct chat_harmony *h);
void chat_harmony_free(struct chat_harmony *h);

#endif

/* chat: the Qwen family's ChatML conversation format:
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... <|im_start|>assistant\n
 * With thinking disabled, Qwen3's template pre-fills an empty <think></think> block. */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stdbool.h>

struct chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
};

/* Renders msgs[0..n) and, if add_assistant, the opening of the assistant's turn (with an empty
 * think block when !think). *out is malloc'd and NUL-terminated. 0 or -ENOMEM. */
int chat_render_chatml(const struct chat_msg *msgs, int n, bool add_assistant, bool think,
                       char **out);

#endif

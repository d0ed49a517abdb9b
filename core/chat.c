#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

int chat_render_chatml(const struct chat_msg *msgs, int n, bool add_assistant, bool think,
                       char **out)
{
    size_t cap = 64;
    char *buf, *p;

    for (int i = 0; i < n; i++)
        cap += strlen(msgs[i].role) + strlen(msgs[i].content) + 32;
    buf = malloc(cap);
    if (!buf)
        return err_set(-ENOMEM, "out of memory");
    p = buf;
    for (int i = 0; i < n; i++)
        p += sprintf(p, "<|im_start|>%s\n%s<|im_end|>\n", msgs[i].role, msgs[i].content);
    if (add_assistant)
        p += sprintf(p, "<|im_start|>assistant\n%s", think ? "" : "<think>\n\n</think>\n\n");
    *p = '\0';
    *out = buf;
    return 0;
}

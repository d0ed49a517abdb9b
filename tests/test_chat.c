/* test_chat: the conversation formats of core/chat.h.
 *   - ChatML renders as before (with and without the empty think block).
 *   - Qwen3.5: the texts Qwen3.5's released chat template renders (jinja2 with transformers'
 *     settings, trim_blocks and lstrip_blocks) for four conversations, with and without
 *     thinking, an earlier reply with reasoning and padding; its refusals.
 *   - harmony: the system header (identity, cutoff, date, reasoning effort, channels) only when
 *     the messages open the conversation, a system message as the developer's instructions, an
 *     earlier assistant reply on its final channel, the assistant's opening; the exact text of
 *     a two-message conversation.
 *   - the reply splitter: a reply with an analysis and a final message yields each channel's
 *     text and nothing of the headers, whether it arrives in one piece, byte by byte or in
 *     every split into three pieces; a "<" that starts no marker stays text; <|return|> ends
 *     the reply; the final text is kept.
 * Deterministic. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "testutil.h"

static void check_chatml(void)
{
    struct chat_msg m[2] = {{"system", "be brief"}, {"user", "hi"}};
    char *out = NULL;
    CHECK(chat_render_chatml(m, 2, true, false, &out) == 0 &&
              !strcmp(out,
                      "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
          "chatml: %s", out ? out : "(null)");
    free(out);
    CHECK(chat_format_of_arch("gpt-oss") == CHAT_FORMAT_HARMONY &&
              chat_format_of_arch("qwen3moe") == CHAT_FORMAT_CHATML,
          "formats of the architectures");
}

static void check_qwen35(void)
{
    static const struct {
        struct chat_msg m[3];
        int n;
        bool think;
        const char *want;
    } cases[] = {
        {{{"system", "be brief"}, {"user", "hi"}},
         2,
         true,
         "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
         "<|im_start|>assistant\n<think>\n"},
        {{{"system", "be brief"}, {"user", "hi"}},
         2,
         false,
         "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
         "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
        {{{"user", "  hi\n"},
          {"assistant", "let me think\n</think>\n\n  hello there \n"},
          {"user", "more"}},
         3,
         true,
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n  hello there<|im_end|>\n"
         "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n<think>\n"},
        {{{"user", "a"}, {"assistant", "plain reply"}, {"user", "b"}},
         3,
         false,
         "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nplain reply<|im_end|>\n"
         "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct chat_style st = {.format = CHAT_FORMAT_QWEN35, .think = cases[i].think};
        char *out = NULL;
        CHECK(chat_render(&st, cases[i].m, cases[i].n, true, &out) == 0 && out &&
                  !strcmp(out, cases[i].want),
              "qwen35 case %zu:\n%s\nwant\n%s", i, out ? out : "(null)", cases[i].want);
        free(out);
    }
    struct chat_style st = {.format = CHAT_FORMAT_QWEN35, .think = true};
    struct chat_msg late[2] = {{"user", "hi"}, {"system", "late"}}, none[1] = {{"system", "x"}};
    char *out = NULL;
    CHECK(chat_render(&st, late, 2, true, &out) == -EINVAL && !out,
          "qwen35: a late system message");
    CHECK(chat_render(&st, none, 1, true, &out) == -EINVAL && !out, "qwen35: no user message");
    CHECK(chat_format_of_arch("qwen35moe") == CHAT_FORMAT_QWEN35 &&
              chat_format_of_arch("qwen3next") == CHAT_FORMAT_CHATML,
          "qwen35moe's format");
}

static void check_harmony_render(void)
{
    struct chat_msg m[3] = {
        {"system", "Answer in French."}, {"user", "hi"}, {"assistant", "salut"}};
    struct chat_style st = {
        .format = CHAT_FORMAT_HARMONY, .think = true, .start = true, .date = "2026-12-02"};
    char *out = NULL;
    CHECK(chat_render(&st, m, 2, true, &out) == 0, "render");
    const char *want =
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2026-12-02\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.<|end|><|start|>developer<|message|># Instructions\n\nAnswer in French.<|end|>"
        "<|start|>user<|message|>hi<|end|><|start|>assistant";
    CHECK(out && !strcmp(out, want), "harmony opening:\n%s\nwant\n%s", out ? out : "", want);
    free(out);
    /* a later turn: no header; the earlier reply on its final channel; low effort */
    st.start = false;
    st.think = false;
    CHECK(chat_render(&st, m + 1, 2, true, &out) == 0 &&
              !strcmp(out, "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final"
                           "<|message|>salut<|end|><|start|>assistant"),
          "harmony later turn: %s", out ? out : "");
    free(out);
    st.start = true;
    st.date = NULL;
    CHECK(chat_render(&st, m + 1, 1, false, &out) == 0 && strstr(out, "Reasoning: low") &&
              !strstr(out, "Current date") && !strstr(out, "<|start|>assistant"),
          "harmony without date or assistant: %s", out ? out : "");
    free(out);
    const char *const *stops = chat_stops(CHAT_FORMAT_HARMONY);
    CHECK(stops[0] && !strcmp(stops[0], "<|return|>") && stops[1] &&
              !strcmp(stops[1], "<|call|>") && !stops[2],
          "harmony stops");
}

struct got {
    char analysis[256], final[256], other[256];
};

static void got_emit(void *ctx, const char *channel, const char *text, size_t len)
{
    struct got *g = ctx;
    char *dst = !strcmp(channel, "analysis") ? g->analysis
                : !strcmp(channel, "final")  ? g->final
                                             : g->other;
    strncat(dst, text, len);
}

static const char *reply = "<|channel|>analysis<|message|>User says hi. 2<3 is <| true.<|end|>"
                           "<|start|>assistant<|channel|>final<|message|>Hello <there>!<|return|>";

static void feed_split(const char *r, size_t a, size_t b, struct got *g, struct chat_harmony *h)
{
    size_t n = strlen(r);
    memset(g, 0, sizeof(*g));
    chat_harmony_init(h, got_emit, g);
    chat_harmony_feed(h, r, a);
    chat_harmony_feed(h, r + a, b - a);
    chat_harmony_feed(h, r + b, n - b);
    chat_harmony_flush(h);
}

static void check_harmony_parse(void)
{
    struct chat_harmony h;
    struct got g;
    size_t n = strlen(reply), bad = 0;

    feed_split(reply, n, n, &g, &h);
    CHECK(!strcmp(g.analysis, "User says hi. 2<3 is <| true.") &&
              !strcmp(g.final, "Hello <there>!") && !g.other[0] && h.done,
          "one piece: analysis '%s' final '%s' other '%s' done %d", g.analysis, g.final, g.other,
          h.done);
    CHECK(h.final && !strcmp(h.final, "Hello <there>!"), "kept final: %s",
          h.final ? h.final : "(null)");
    chat_harmony_free(&h);
    /* every split into three pieces (which covers byte by byte at each position) */
    for (size_t a = 0; a <= n; a++)
        for (size_t b = a; b <= n; b++) {
            feed_split(reply, a, b, &g, &h);
            bad += strcmp(g.analysis, "User says hi. 2<3 is <| true.") ||
                   strcmp(g.final, "Hello <there>!") || g.other[0] || !h.done;
            chat_harmony_free(&h);
        }
    CHECK(bad == 0, "%zu of the three-piece splits differ", bad);
    memset(&g, 0, sizeof(g));
    chat_harmony_init(&h, got_emit, &g);
    for (size_t i = 0; i < n; i++)
        chat_harmony_feed(&h, reply + i, 1);
    chat_harmony_flush(&h);
    CHECK(!strcmp(g.final, "Hello <there>!") && h.done, "byte by byte: final '%s'", g.final);
    chat_harmony_free(&h);
    /* a message with no channel counts as final; a commentary channel is passed on as such */
    feed_split("<|message|>plain<|end|><|start|>assistant<|channel|>commentary to=x "
               "<|constrain|>json<|message|>{}<|call|>",
               5, 30, &g, &h);
    CHECK(!strcmp(g.final, "plain") && !strcmp(g.other, "{}") && h.done,
          "no channel / commentary: final '%s' other '%s'", g.final, g.other);
    chat_harmony_free(&h);
}

int main(void)
{
    check_chatml();
    check_qwen35();
    check_harmony_render();
    check_harmony_parse();
    return test_finish("test_chat");
}

/* backend_profile: the wrapper forwards the optional ops its backend has (q/k/v in one call,
 * the decode steps' clock that picks the CPU thread count, the argmax where the logits are) and
 * leaves out the ones it lacks, passes arguments and results through, counts q/k/v in one call
 * as one matmul, and closes the backend it wraps. A made-up backend records what reaches it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_profile.h"
#include "testutil.h"

static struct {
    int matmul_n, n_last, eval_begin, eval_tokens, argmax, closed;
    const float *in;
} seen;

static int fake_matmul(struct backend *b, float *out, const struct weight *w, const float *in,
                       int m)
{
    (void)b, (void)out, (void)w, (void)in, (void)m;
    return 0;
}

static int fake_matmul_n(struct backend *b, int n, float *const *out,
                         const struct weight *const *w, const float *in, int m)
{
    (void)b, (void)out, (void)w, (void)m;
    seen.matmul_n++;
    seen.n_last = n;
    seen.in = in;
    return n == 3 ? 0 : -EINVAL;
}

static void fake_eval_begin(struct backend *b, int n)
{
    (void)b;
    seen.eval_begin++;
    seen.eval_tokens += n;
}

static int fake_read_argmax(struct backend *b, const float *x, int n, int32_t *out)
{
    (void)b, (void)x;
    seen.argmax++;
    *out = n - 1;
    return 0;
}

static void fake_close(struct backend *b)
{
    (void)b;
    seen.closed++;
}

/* The report of `b` as a string (caller frees). */
static char *report(struct backend *b)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL, "open_memstream failed");
    if (!f)
        return NULL;
    backend_profile_report(b, f, "decode");
    fclose(f);
    return text;
}

int main(void)
{
    const struct backend_ops full = {.name = "fake",
                                     .matmul = fake_matmul,
                                     .matmul_n = fake_matmul_n,
                                     .eval_begin = fake_eval_begin,
                                     .read_argmax = fake_read_argmax,
                                     .close = fake_close};
    struct backend inner = {.ops = &full}, *p = NULL;
    CHECK(backend_profile_open(&inner, &p) == 0 && p, "wrapping failed");

    CHECK(p->ops->matmul_n && p->ops->eval_begin && p->ops->read_argmax,
          "the wrapper dropped an op its backend has");
    if (!p->ops->matmul_n || !p->ops->eval_begin || !p->ops->read_argmax)
        return test_finish("test_backend_profile");
    float x[4] = {0};
    float *out[3] = {x, x, x};
    const struct weight *w[3] = {NULL, NULL, NULL};
    CHECK(p->ops->matmul_n(p, 3, out, w, x, 1) == 0, "matmul_n's result not passed through");
    CHECK(p->ops->matmul_n(p, 2, out, w, x, 1) == -EINVAL, "matmul_n's error not passed through");
    CHECK(seen.matmul_n == 2 && seen.n_last == 2 && seen.in == x,
          "matmul_n reached the backend %d times (n %d)", seen.matmul_n, seen.n_last);
    p->ops->eval_begin(p, 1);
    p->ops->eval_begin(p, 5);
    CHECK(seen.eval_begin == 2 && seen.eval_tokens == 6,
          "eval_begin reached the backend %d times with %d tokens", seen.eval_begin,
          seen.eval_tokens);
    int32_t id = -1;
    CHECK(p->ops->read_argmax(p, x, 4, &id) == 0 && id == 3 && seen.argmax == 1,
          "read_argmax: %d (calls %d)", id, seen.argmax);
    char *text = report(p);
    CHECK(text && strstr(text, "matmul") && strstr(text, " 2 ") && strstr(text, "read"),
          "the report does not count the two matmul_n calls as matmul:\n%s", text ? text : "");
    free(text);
    backend_close(p);
    CHECK(seen.closed == 1, "closing the wrapper closed its backend %d times", seen.closed);

    /* a backend without the optional ops: the wrapper has none either, so callers take their
     * fallbacks (one matmul each; no step clock) */
    const struct backend_ops bare = {.name = "bare", .matmul = fake_matmul, .close = fake_close};
    struct backend inner2 = {.ops = &bare};
    CHECK(backend_profile_open(&inner2, &p) == 0 && p, "wrapping failed");
    CHECK(!p->ops->matmul_n && !p->ops->eval_begin && !p->ops->read_argmax,
          "the wrapper offers an op its backend lacks (matmul_n %p, eval_begin %p, "
          "read_argmax %p)",
          (void *)p->ops->matmul_n, (void *)p->ops->eval_begin, (void *)p->ops->read_argmax);
    backend_close(p);
    return test_finish("test_backend_profile");
}

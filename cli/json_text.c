/* json_text: ill-formed UTF-8 in generated text replaced by U+FFFD (json_text.h). */
#include "json_text.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* The length of the valid character at s (n bytes left), or the negative length of the
 * maximal ill-formed subsequence there: the longest prefix of a well-formed sequence, at least
 * one byte. */
static long char_len(const unsigned char *s, size_t n)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &cp);
    if (k > 0)
        return (long)k;
    /* How many bytes a well-formed sequence starting here could share with this one: the lead
     * byte's range restricts the second byte (Unicode Table 3-7). */
    unsigned char b = s[0];
    size_t want;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
        want = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        want = 3;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        want = 4;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else
        return -1;
    size_t i = 1;
    if (i < n && i < want && s[i] >= lo && s[i] <= hi)
        i++;
    else
        return -1;
    while (i < n && i < want && s[i] >= 0x80 && s[i] <= 0xBF)
        i++;
    return -(long)i;
}

size_t json_text_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t out = 0;
    for (size_t i = 0; i < n;) {
        long k = char_len(u + i, n - i);
        out += k > 0 ? (size_t)k : sizeof(REPL);
        i += (size_t)(k > 0 ? k : -k);
    }
    return out;
}

void json_text_copy(const char *s, size_t n, char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        long k = char_len(u + i, n - i);
        if (k > 0) {
            memcpy(out, s + i, (size_t)k);
            out += k;
            i += (size_t)k;
        } else {
            memcpy(out, REPL, sizeof(REPL));
            out += sizeof(REPL);
            i += (size_t)-k;
        }
    }
}

json_object *json_text_new(const char *s, size_t n)
{
    size_t m = json_text_len(s, n);
    if (m == n)
        return json_object_new_string_len(s, (int)n);
    char *t = malloc(m ? m : 1);
    if (!t)
        return NULL;
    json_text_copy(s, n, t);
    json_object *o = json_object_new_string_len(t, (int)m);
    free(t);
    return o;
}

/* json_text: model output as JSON strings. Generated text is whatever bytes the sampled tokens
 * stand for, which need not be valid UTF-8 (a byte-level vocabulary can emit a lone
 * continuation byte or a lead byte whose character never completes). JSON text must be UTF-8,
 * so each maximal ill-formed subsequence becomes U+FFFD, as the Unicode standard recommends
 * (and as browsers decode). Valid input passes through byte for byte. */
#ifndef STRATA_CLI_JSON_TEXT_H
#define STRATA_CLI_JSON_TEXT_H

#include <json-c/json.h>
#include <stddef.h>

/* A json-c string of the N bytes at S with ill-formed sequences replaced; NULL without
 * memory. */
json_object *json_text_new(const char *s, size_t n);

/* The byte count of S[0..n) after the replacement (for callers sizing a copy). */
size_t json_text_len(const char *s, size_t n);

/* Writes S[0..n) with the replacement into OUT (json_text_len(s, n) bytes, not terminated). */
void json_text_copy(const char *s, size_t n, char *out);

#endif

/* ops_cpu_avx2: attention's inner unit (attn_body.h) compiled with AVX2 + FMA, in vectors of
 * 8 floats, for CPUs without AVX-512. */
#define ATTN_VEC 8
#include "attn_body.h"

void ops_attn_unit_avx2(const struct ops_attn *a, int t, int h0, int nh, int j_begin, int j_end,
                        float *part, size_t part_stride)
{
    attn_unit(a, t, h0, nh, j_begin, j_end, part, part_stride);
}

void ops_attn_tokens_avx2(const struct ops_attn *a, int t0, int nt, int h0, int nh)
{
    attn_tokens(a, t0, nt, h0, nh);
}

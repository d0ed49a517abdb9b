/* ops_ssm_avx512: the gated delta rule's per-head step (ssm_body.h) compiled with AVX-512. */
#include "ssm_body.h"

void ops_gdn_head_avx512(const struct ops_gdn *g, int j)
{
    gdn_head(g, j);
}

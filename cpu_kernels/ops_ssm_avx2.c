/* ops_ssm_avx2: the gated delta rule's per-head step (ssm_body.h) compiled with AVX2 + FMA. */
#include "ssm_body.h"

void ops_gdn_head_avx2(const struct ops_gdn *g, int j)
{
    gdn_head(g, j);
}

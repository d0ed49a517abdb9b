#include "arch.h"

#include <string.h>

static const struct arch *const arch_table[] = {&arch_qwen3moe};

const struct arch *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++) {
        if (!strcmp(arch_table[i]->name, name))
            return arch_table[i];
    }
    return NULL;
}

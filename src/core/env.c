/* env.c — reading the environment variables listed in env.h. */
#include <stdlib.h>
#include <string.h>

#include "core/env.h"

const char *dw_env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bool dw_env_flag(const char *name, bool dflt) {
    const char *v = dw_env(name);
    if (v && !strcmp(v, "0")) return false;
    if (v && !strcmp(v, "1")) return true;
    return dflt;
}

/* The smallest user of native/interpose: wraps cuInit, cuDriverGetVersion and cuLaunchKernel and says
 * so on stderr; wrapping is on when MN_IP_TEST_ON is set. */
#include "interpose.h"

#include <stdio.h>
#include <stdlib.h>

static CUresult w_init(const mn_ip_slot *s, unsigned int flags) {
  fprintf(stderr, "wrapped cuInit\n");
  return ((PFN_cuInit_v2000)s->real)(flags);
}
static CUresult w_version(const mn_ip_slot *s, int *v) {
  fprintf(stderr, "wrapped cuDriverGetVersion\n");
  return ((PFN_cuDriverGetVersion_v2020)s->real)(v);
}
static CUresult w_launch(const mn_ip_slot *s, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shm, CUstream st, void **params, void **extra) {
  fprintf(stderr, "wrapped cuLaunchKernel ptsz=%d stream=%p\n", s->ptsz, (void *)mn_ip_stream(s, st));
  return ((PFN_cuLaunchKernel_v4000)s->real)(f, gx, gy, gz, bx, by, bz, shm, st, params, extra);
}

MN_IP_DEFINE(init, PFN_cuInit_v2000, w_init, (unsigned int flags), flags)
MN_IP_DEFINE(version, PFN_cuDriverGetVersion_v2020, w_version, (int *v), v)
MN_IP_DEFINE(launch, PFN_cuLaunchKernel_v4000, w_launch,
             (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm,
              CUstream st, void **params, void **extra),
             f, gx, gy, gz, bx, by, bz, shm, st, params, extra)

mn_ip_entry mn_ip_table[] = {
    MN_IP_ENTRY(init, "cuInit", "", 2000, 0),
    MN_IP_ENTRY(version, "cuDriverGetVersion", "", 2020, 0),
    MN_IP_ENTRY(launch, "cuLaunchKernel", "", 4000, 0),
};
const size_t mn_ip_table_len = sizeof mn_ip_table / sizeof mn_ip_table[0];

int mn_ip_enabled(void) { return getenv("MN_IP_TEST_ON") != NULL; }
void mn_ip_bare(const char *name, int version, const char *why) { fprintf(stderr, "bare %s %d: %s\n", name, version, why); }
void mn_ip_no_driver(const char *why) { fprintf(stderr, "no driver: %s\n", why); }

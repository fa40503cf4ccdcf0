/*
 * gpu_staging.h - the cuda backend's loads onto a device (gpu_staging.c): its dev_load and
 * dev_settle (backend.h says what they promise).  CUDA builds only.
 */
#ifndef NWCD_GPU_STAGING_H
#define NWCD_GPU_STAGING_H

#include "loader.h"
#include "nwc_store.h"

#include <stdbool.h>

/* dev_load: a device copy of ti's blob on dev (backend.h). */
int nwcd_gpu_dev_load(const nwc_tensor_info *ti, int dev, void **dcopy, nwcd_load_info *li);
/* places_load: one read of ti's blob into a host copy (host) and a device copy on each of
 * devs[0..n) (backend.h). */
int nwcd_gpu_places_load(const nwc_tensor_info *ti, bool host, void **p, bool *locked,
                         const int *devs, int n, void **dcopy, nwcd_load_info *li);
/* dev_settle: waits for the copies that queued loads left running on dev's rings. */
int nwcd_gpu_dev_settle(int dev);

#endif

/* gpu_upload.h — the GPU tests' device buffers from host bytes and back (include after cmocka.h).
 * The upload waits for its copy: cudaMemcpy from pageable host memory may return before the DMA
 * lands, and the context's stream, non-blocking, would not wait for it (session 19: a fresh
 * buffer at the address a previous result had just left read those bytes). The download waits
 * for all device work first. */
#ifndef DW_TEST_GPU_UPLOAD_H
#define DW_TEST_GPU_UPLOAD_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdlib.h>

/* a new device buffer of n bytes (at least 1) holding h's bytes (none when h is NULL) */
static inline void *dw_test_to_dev(const void *h, size_t n) {
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, n ? n : 1), cudaSuccess);
    if (n && h) assert_int_equal(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    return d;
}
/* n bytes of d into h, after the device's work so far */
static inline void dw_test_from_dev(void *h, const void *d, size_t n) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    if (n) assert_int_equal(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* a new host buffer holding n bytes of d, after the device's work so far (free it) */
static inline void *dw_test_from_dev_new(const void *d, size_t n) {
    void *h = malloc(n ? n : 1);
    assert_non_null(h);
    dw_test_from_dev(h, d, n);
    return h;
}

#endif

/* Stand-in for CUDA's cuda_runtime_api.h when building wsitool._jpegloop.
 *
 * nvimgcodec.h includes <cuda_runtime_api.h> only for the opaque stream type
 * cudaStream_t.  The CPU tile loop never passes a stream, so this header gives
 * the same opaque pointer type and nothing else: the extension builds on
 * machines without a CUDA toolkit and does not depend on its version. */
#ifndef WSITOOL_CUDA_RUNTIME_API_SHIM_H
#define WSITOOL_CUDA_RUNTIME_API_SHIM_H
typedef struct CUstream_st* cudaStream_t;
#endif

// Declarations of the part of the CUDA runtime API that ddp/ uses, with the
// CUDA 12 names, types and values, and nothing else: no definitions, no
// library. They exist so that the default build compiles the NCCL sources
// (//ddp:nccl_compile_check) and a change that would break the GPU build
// breaks this one. Never linked: a binary built against them would not link.
// The GPU build includes the toolkit's own header instead (/usr/local/cuda).
#ifndef LOCKSTEP_THIRD_PARTY_CUDA_API_CUDA_RUNTIME_API_H_
#define LOCKSTEP_THIRD_PARTY_CUDA_API_CUDA_RUNTIME_API_H_

#define CUDART_CB

#ifdef __cplusplus
#define LOCKSTEP_CUDA_DEFAULT(v) = v
extern "C" {
#else
#define LOCKSTEP_CUDA_DEFAULT(v)
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
  cudaErrorUnknown = 999,
} cudaError_t;

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef void(CUDART_CB* cudaHostFn_t)(void* user_data);

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError(void);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least_priority, int* greatest_priority);

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags LOCKSTEP_CUDA_DEFAULT(0));
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream LOCKSTEP_CUDA_DEFAULT(0));
cudaError_t cudaEventQuery(cudaEvent_t event);

#ifdef __cplusplus
}  // extern "C"
#endif
#undef LOCKSTEP_CUDA_DEFAULT

#endif  // LOCKSTEP_THIRD_PARTY_CUDA_API_CUDA_RUNTIME_API_H_

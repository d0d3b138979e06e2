// FLASHKV_HD: functions compiled for the host and (under nvcc) the device — the mask rule, the lse merge, the KV format
// trait and page layout share it.
#pragma once

#ifndef FLASHKV_HD
#if defined(__CUDACC__)
#define FLASHKV_HD __host__ __device__ __forceinline__
#else
#define FLASHKV_HD inline
#endif
#endif

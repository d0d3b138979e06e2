// cuBLAS products of the CUDA engine (gemm.hpp). cuBLAS is loaded at the first CUDA engine (dlopen), not linked:
// libflashkv.so and the CLI keep no dependency on the 600 MB cuBLAS / cuBLASLt pair, so everything that does not use
// the CUDA engine loads where cuBLAS is absent, and the engine names what it could not find.
#include "engine/cuda/gemm.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "engine/dlopen_first.hpp"
#include "flashkv/error.hpp"

namespace flashkv::engine_cuda {
namespace {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  std::string error;  ///< why loading failed ("" = loaded)
};

/// $FLASHKV_CUBLAS, then the cuBLAS 13 soname (LD_LIBRARY_PATH, the loader cache, an already loaded copy such as
/// torch's), then the toolkit's default location.
const CublasApi& api() {
  static const CublasApi a = [] {
    CublasApi r;
    const engine_detail::DlopenResult lib = engine_detail::dlopen_first(
        "FLASHKV_CUBLAS", {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13"}, [&r](void* h) -> std::string {
          r.create = reinterpret_cast<decltype(r.create)>(::dlsym(h, "cublasCreate_v2"));
          r.destroy = reinterpret_cast<decltype(r.destroy)>(::dlsym(h, "cublasDestroy_v2"));
          r.gemm_ex = reinterpret_cast<decltype(r.gemm_ex)>(::dlsym(h, "cublasGemmEx"));
          r.status_name = reinterpret_cast<decltype(r.status_name)>(::dlsym(h, "cublasGetStatusName"));
          r.set_stream = reinterpret_cast<decltype(r.set_stream)>(::dlsym(h, "cublasSetStream_v2"));
          r.set_workspace = reinterpret_cast<decltype(r.set_workspace)>(::dlsym(h, "cublasSetWorkspace_v2"));
          return r.create && r.destroy && r.gemm_ex && r.status_name && r.set_stream && r.set_workspace
                     ? ""
                     : "missing cublasCreate_v2 / cublasGemmEx / cublasSetStream_v2 / cublasSetWorkspace_v2";
        });
    if (lib.handle != nullptr) return r;
    r.error = "flashkv: the CUDA engine needs cuBLAS 13 (libcublas.so.13) and could not load it (" + lib.tried +
              "); put its directory on LD_LIBRARY_PATH or set FLASHKV_CUBLAS to the file";
    return r;
  }();
  return a;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("flashkv: cuBLAS error in ") + what + ": " + api().status_name(s), Status::internal);
}

}  // namespace

Blas::Blas(cudaStream_t stream) {
  if (!api().error.empty()) throw UnsupportedError(api().error);
  check_blas(api().create(&handle_), "cublasCreate");
  if (cudaMalloc(&workspace_, kWorkspaceBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    workspace_ = nullptr;
    api().destroy(handle_);
    handle_ = nullptr;
    throw CapacityError("flashkv: CUDA engine: cannot allocate the cuBLAS workspace (" +
                        std::to_string(kWorkspaceBytes) + " bytes)");
  }
  // cublasSetStream resets the workspace to cuBLAS's own pool: the stream first, then our workspace.
  check_blas(api().set_stream(handle_, stream), "cublasSetStream");
  check_blas(api().set_workspace(handle_, workspace_, kWorkspaceBytes), "cublasSetWorkspace");
}
Blas::~Blas() {
  if (handle_ != nullptr) api().destroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void Blas::matmul(const uint16_t* x, int t, int in, const uint16_t* w, int out, float* y, float beta) const {
  if (t == 0) return;
  const float alpha = 1.0f;
  // Column-major view: yᵀ [out, t] = (w viewed as [in, out])ᵀ · xᵀ [in, t].
  check_blas(api().gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, t, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF,
                           in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx (bf16 x bf16 -> float32)");
}

}  // namespace flashkv::engine_cuda

// cuBLASLt FP8 GEMM of the FP8 tests' baseline (fp8_gemm_cublaslt.hpp).
#include "fp8_gemm_cublaslt.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "engine/dlopen_first.hpp"

namespace flashkv::cudatest::fp8 {
namespace {

struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_get = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  std::string path, error;  ///< the file taken; why loading failed ("" = loaded)
};

template <class F>
bool sym(void* h, F& f, const char* name) {
  f = reinterpret_cast<F>(::dlsym(h, name));
  return f != nullptr;
}

const LtApi& api() {
  static const LtApi a = [] {
    LtApi r;
    std::vector<std::string> candidates = {"libcublasLt.so.13"};
    if (const char* blas = std::getenv("FLASHKV_CUBLAS"); blas != nullptr && *blas != '\0') {
      const std::string p(blas);
      const size_t slash = p.rfind('/');
      if (slash != std::string::npos) candidates.push_back(p.substr(0, slash + 1) + "libcublasLt.so.13");
    }
    candidates.emplace_back("/usr/local/cuda/lib64/libcublasLt.so.13");
    const engine_detail::DlopenResult lib =
        engine_detail::dlopen_first("FLASHKV_CUBLASLT", candidates, [&r](void* h) -> std::string {
          const bool ok = sym(h, r.create, "cublasLtCreate") && sym(h, r.destroy, "cublasLtDestroy") &&
                          sym(h, r.desc_create, "cublasLtMatmulDescCreate") &&
                          sym(h, r.desc_destroy, "cublasLtMatmulDescDestroy") &&
                          sym(h, r.desc_set, "cublasLtMatmulDescSetAttribute") &&
                          sym(h, r.layout_create, "cublasLtMatrixLayoutCreate") &&
                          sym(h, r.layout_destroy, "cublasLtMatrixLayoutDestroy") &&
                          sym(h, r.pref_create, "cublasLtMatmulPreferenceCreate") &&
                          sym(h, r.pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
                          sym(h, r.pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
                          sym(h, r.heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
                          sym(h, r.algo_get, "cublasLtMatmulAlgoConfigGetAttribute") &&
                          sym(h, r.matmul, "cublasLtMatmul") &&
                          sym(h, r.status_string, "cublasLtGetStatusString");
          return ok ? "" : "missing cublasLt matmul symbols";
        });
    if (lib.handle != nullptr) {
      r.path = lib.path;
    } else {
      r.error = "the FP8 tests' baseline needs cuBLASLt 13 (libcublasLt.so.13) and could not load it (" + lib.tried +
                "); put its directory on LD_LIBRARY_PATH or set FLASHKV_CUBLASLT to the file";
    }
    return r;
  }();
  return a;
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLASLt ") + what + ": " + api().status_string(s));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr size_t kWorkspace = size_t{32} << 20;

}  // namespace

CublasLtFp8Gemm::CublasLtFp8Gemm() {
  if (!api().error.empty()) throw std::runtime_error(api().error);
  cublasLtHandle_t h = nullptr;
  check(api().create(&h), "cublasLtCreate");
  handle_ = h;
}
CublasLtFp8Gemm::~CublasLtFp8Gemm() {
  if (dev_ != nullptr) cudaFree(dev_);
  if (handle_ != nullptr) api().destroy(static_cast<cublasLtHandle_t>(handle_));
}
const std::string& CublasLtFp8Gemm::library() const { return api().path; }

void CublasLtFp8Gemm::operator()(const uint8_t* a, const uint8_t* b, int m, int n, int k, float* d) {
  if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 16)
    throw std::invalid_argument("CublasLtFp8Gemm: m, n, k must be positive multiples of 16, got " + std::to_string(m) +
                                ", " + std::to_string(n) + ", " + std::to_string(k));
  const LtApi& L = api();
  const size_t a_bytes = static_cast<size_t>(m) * k, b_bytes = static_cast<size_t>(n) * k;
  const size_t d_bytes = static_cast<size_t>(m) * n * sizeof(float);
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };  // 256-byte aligned sub-buffers (cuBLASLt: >= 16)
  const size_t need = up(a_bytes) + up(b_bytes) + up(d_bytes) + kWorkspace;
  if (need > dev_bytes_) {
    if (dev_ != nullptr) cudaFree(dev_);
    dev_ = nullptr, dev_bytes_ = 0;
    check(cudaMalloc(&dev_, need), "cudaMalloc");
    dev_bytes_ = need;
  }
  auto* base = static_cast<uint8_t*>(dev_);
  uint8_t* da = base;
  uint8_t* db = da + up(a_bytes);
  auto* dd = reinterpret_cast<float*>(db + up(b_bytes));
  void* ws = reinterpret_cast<uint8_t*>(dd) + up(d_bytes);
  check(cudaMemcpy(da, a, a_bytes, cudaMemcpyHostToDevice), "cudaMemcpy a");
  check(cudaMemcpy(db, b, b_bytes, cudaMemcpyHostToDevice), "cudaMemcpy b");

  // Column-major D (m x n) = Aᵀ B: A is k x m (lda k, i.e. a's rows), B is k x n (ldb k, b's rows).
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct Cleanup {
    const LtApi& L;
    cublasLtMatmulDesc_t& op;
    cublasLtMatrixLayout_t &la, &lb, &ld;
    cublasLtMatmulPreference_t& pref;
    ~Cleanup() {
      if (pref) L.pref_destroy(pref);
      if (ld) L.layout_destroy(ld);
      if (lb) L.layout_destroy(lb);
      if (la) L.layout_destroy(la);
      if (op) L.desc_destroy(op);
    }
  } cleanup{L, op, la, lb, ld, pref};
  check(L.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast_accum = 1;
  check(L.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
  check(L.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
  check(L.desc_set(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum), "set FAST_ACCUM");
  check(L.layout_create(&la, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k), "layout A");
  check(L.layout_create(&lb, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k), "layout B");
  check(L.layout_create(&ld, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n), m), "layout D");
  check(L.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  const size_t ws_bytes = kWorkspace;
  check(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes), "set workspace");
  // The first algorithm without split-K: a split-K reduction would add partial sums in CUDA-core float32, more
  // accurately than the kernel's single accumulation chain (when every candidate splits: the first).
  cublasLtMatmulHeuristicResult_t heur[8] = {};
  int found = 0;
  check(L.heuristic(static_cast<cublasLtHandle_t>(handle_), op, la, lb, ld, ld, pref, 8, heur, &found),
        "cublasLtMatmulAlgoGetHeuristic (e4m3 x e4m3 -> float32, TN)");
  if (found == 0) throw std::runtime_error("cuBLASLt: no FP8 (e4m3 x e4m3 -> float32, TN) algorithm on this device");
  const cublasLtMatmulAlgo_t* algo = &heur[0].algo;
  for (int i = 0; i < found; ++i) {
    int32_t splitk = 1;
    size_t written = 0;
    if (L.algo_get(&heur[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &written) !=
            CUBLAS_STATUS_SUCCESS ||
        splitk <= 1) {
      algo = &heur[i].algo;
      break;
    }
  }
  const float alpha = 1.f, beta = 0.f;
  check(L.matmul(static_cast<cublasLtHandle_t>(handle_), op, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld,
                 algo, ws, kWorkspace, nullptr),
        "cublasLtMatmul (e4m3 x e4m3 -> float32, TN)");
  check(cudaMemcpy(d, dd, d_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy d");
}

}  // namespace flashkv::cudatest::fp8

// Testbed of the transformer kernels: the same call on the CPU backend (the reference)
// and on the CUDA backend, each on its own copy of the same seeded data, then both results
// compared (atol + rtol·|ref|, the reference checked non-zero first). Skips without a
// device (CudaTest).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_testbed.hpp"
#include "harness/backends/cpu_backend.hpp"

namespace shardscope::testing {

enum class Side { cpu, cuda };

// One tensor on both backends.
struct Twin {
  Buffer cpu;
  Buffer cuda;
  float* at(Side s) const { return s == Side::cpu ? cpu.data() : cuda.data(); }
  std::size_t count() const { return cpu.count(); }
};

inline std::vector<float> nans(std::size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// int64 ids in the floats of a Buffer (2 floats a token, transformer_args.hpp).
inline std::vector<float> id_floats_of(const std::vector<std::int64_t>& ids) {
  std::vector<float> f(static_cast<std::size_t>(id_floats(static_cast<std::int64_t>(ids.size()))));
  std::memcpy(f.data(), ids.data(), ids.size() * sizeof(std::int64_t));
  return f;
}

class CudaVsCpuTest : public CudaTest {
 protected:
  Twin twin(const std::vector<float>& host) {
    Twin t;
    t.cpu = cpu_.alloc(Category::temp, host.size());
    cpu_.upload(t.cpu.data(), host.data(), host.size());
    t.cuda = to_device(host);
    return t;
  }

  // f(backend, side) on the CPU backend, then on the CUDA one.
  template <typename F>
  void on_both(F f) {
    f(static_cast<Backend&>(cpu_), Side::cpu);
    f(static_cast<Backend&>(*backend_), Side::cuda);
  }

  std::vector<float> cpu_values(const Twin& t) {
    std::vector<float> h(t.count());
    cpu_.download(h.data(), t.cpu.data(), h.size());
    return h;
  }
  std::vector<float> cuda_values(const Twin& t) { return to_host(t.cuda); }

  // The CUDA result within atol + rtol·|cpu| of the CPU one, which is not all zeros.
  ::testing::AssertionResult same(const Twin& t, double atol, double rtol, const char* what) {
    const auto ref = cpu_values(t);
    const auto got = cuda_values(t);
    auto nz = nonzero(ref, what);
    if (!nz) return nz;
    auto close = all_close(got, ref, atol, rtol);
    if (!close) close << " (" << what << ")";
    return close;
  }

  CpuBackend cpu_;
};

}  // namespace shardscope::testing

#include <torch/extension.h>

#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <atomic>
#include <cstdint>

namespace {
constexpr size_t kHdr = 64;            // keeps c10's 64-byte alignment
struct Counter {
  int64_t live = 0, peak = 0, rpeak = 0;
  int64_t live512 = 0, peak512 = 0, rpeak512 = 0;
  int64_t nalloc = 0;
};
Counter C;
bool g_uncounted = false;
inline int64_t r512(int64_t n) { return ((n + 511) / 512) * 512; }

void del(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHdr;
  int64_t n = reinterpret_cast<int64_t*>(base)[0];
  int64_t counted = reinterpret_cast<int64_t*>(base)[1];
  if (counted) { C.live -= n; C.live512 -= r512(n); }
  c10::free_cpu(base);
}

struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) const override {
    if (nbytes == 0) {
      return {nullptr, nullptr, &del, c10::Device(c10::DeviceType::CPU)};
    }
    char* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHdr));
    reinterpret_cast<int64_t*>(base)[0] = (int64_t)nbytes;
    reinterpret_cast<int64_t*>(base)[1] = g_uncounted ? 0 : 1;
    if (!g_uncounted) {
      C.live += nbytes; C.live512 += r512(nbytes); C.nalloc++;
      if (C.live > C.peak) C.peak = C.live;
      if (C.live > C.rpeak) C.rpeak = C.live;
      if (C.live512 > C.peak512) C.peak512 = C.live512;
      if (C.live512 > C.rpeak512) C.rpeak512 = C.live512;
    }
    void* data = base + kHdr;
    return {data, data, &del, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
};
CountingAllocator g_alloc;
bool g_installed = false;
}  // namespace

void install() {
  if (g_installed) return;
  c10::SetCPUAllocator(&g_alloc, /*priority=*/100);
  g_installed = true;
}
bool installed() { return g_installed; }
int64_t live() { return C.live; }
int64_t peak() { return C.peak; }
int64_t reset_peak() { int64_t r = C.rpeak; C.rpeak = C.live; C.rpeak512 = C.live512; return r; }
int64_t region_peak() { return C.rpeak; }
int64_t live512() { return C.live512; }
int64_t region_peak512() { return C.rpeak512; }
int64_t nalloc() { return C.nalloc; }
bool set_uncounted(bool on) { bool o = g_uncounted; g_uncounted = on; return o; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("installed", &installed);
  m.def("live", &live);
  m.def("peak", &peak);
  m.def("reset_peak", &reset_peak);
  m.def("region_peak", &region_peak);
  m.def("live512", &live512);
  m.def("region_peak512", &region_peak512);
  m.def("nalloc", &nalloc);
  m.def("set_uncounted", &set_uncounted);
}

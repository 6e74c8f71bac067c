"""Exact live-byte counter for torch 2.x's CPU allocator (the real-library oracle).

Builds once (cached under $MMGUARD_TRUTH_BUILD or build/truth/ext) a small C++
extension that puts a c10::Allocator in front of the default CPU allocator
(c10::SetCPUAllocator, priority 100).  Every CPU storage allocated after
install() carries a 64-byte header with its size, whether it was counted and a
tag.  The counter keeps live bytes, the overall peak and a resettable phase
peak.  Optionally it logs every counted alloc/free as (signed bytes, tag) so a
trace can say which op (or module) owns what is alive at the peak.

`uncounted()` lets an emulation allocate scratch that has no counterpart in GPU
memory (SRAM tiles of a fused kernel, host-side RNG state): such blocks and
their frees are not counted.  What is emulated and why: docs/oracle.md.
"""
import contextlib
import os

_SRC = r"""
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <cstdint>
#include <vector>

namespace {
constexpr size_t kHdr = 64;  // keeps c10's 64-byte alignment
struct Counter { int64_t live = 0, peak = 0, rpeak = 0, nalloc = 0; };
Counter C;
bool g_uncounted = false;
bool g_log = false;
int64_t g_tag = 0;
std::vector<int64_t> g_ev;  // triples: signed bytes, tag, live after

inline void note(int64_t b, int64_t tag) {
  if (g_log) { g_ev.push_back(b); g_ev.push_back(tag); g_ev.push_back(C.live); }
}
void del(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHdr;
  int64_t* h = reinterpret_cast<int64_t*>(base);
  if (h[1]) { C.live -= h[0]; note(-h[0], h[2]); }
  c10::free_cpu(base);
}
struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    char* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHdr));
    int64_t* h = reinterpret_cast<int64_t*>(base);
    h[0] = (int64_t)nbytes;
    h[1] = g_uncounted ? 0 : 1;
    h[2] = g_tag;
    if (!g_uncounted) {
      C.live += (int64_t)nbytes; C.nalloc++;
      if (C.live > C.peak) C.peak = C.live;
      if (C.live > C.rpeak) C.rpeak = C.live;
      note((int64_t)nbytes, g_tag);
    }
    void* data = base + kHdr;
    return {data, data, &del, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
  void copy_data(void* d, const void* s, std::size_t n) const override { default_copy_data(d, s, n); }
};
CountingAllocator g_alloc;
bool g_installed = false;
}  // namespace

void install() { if (!g_installed) { c10::SetCPUAllocator(&g_alloc, 100); g_installed = true; } }
bool installed() { return g_installed; }
int64_t live() { return C.live; }
int64_t peak() { return C.peak; }
int64_t reset_peak() { int64_t r = C.rpeak; C.rpeak = C.live; return r; }
int64_t region_peak() { return C.rpeak; }
int64_t nalloc() { return C.nalloc; }
bool set_uncounted(bool on) { bool o = g_uncounted; g_uncounted = on; return o; }
void set_log(bool on) { g_log = on; g_ev.clear(); }
int64_t set_tag(int64_t t) { int64_t o = g_tag; g_tag = t; return o; }
std::vector<int64_t> take_log() { std::vector<int64_t> r; r.swap(g_ev); return r; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install); m.def("installed", &installed);
  m.def("live", &live); m.def("peak", &peak); m.def("reset_peak", &reset_peak);
  m.def("region_peak", &region_peak); m.def("nalloc", &nalloc);
  m.def("set_uncounted", &set_uncounted); m.def("set_log", &set_log);
  m.def("set_tag", &set_tag); m.def("take_log", &take_log);
}
"""

_mod = None
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build_dir():
    d = os.environ.get("MMGUARD_TRUTH_BUILD") or os.path.join(ROOT, "build", "truth", "ext")
    os.makedirs(d, exist_ok=True)
    return d


def load():
    """Build (cached) and return the extension, installed."""
    global _mod
    if _mod is None:
        from torch.utils.cpp_extension import load_inline
        _mod = load_inline(name="mmguard_memhook", cpp_sources=[_SRC],
                           build_directory=build_dir(), extra_cflags=["-O2"], verbose=False)
        _mod.install()
    return _mod


@contextlib.contextmanager
def uncounted():
    """Allocations inside (and their frees) are not counted."""
    old = _mod.set_uncounted(True)
    try:
        yield
    finally:
        _mod.set_uncounted(old)

"""Exact live-byte counter for torch 2.x's CPU allocator (the real-library oracle).

Builds once (cached under $MMGUARD_TRUTH_BUILD or build/truth/ext) a small C++
extension that puts a c10::Allocator in front of the default CPU allocator
(c10::SetCPUAllocator, priority 100).  Every CPU storage allocated after
install() carries a 64-byte header with its size, its category (counted or
why not), a tag and the index of the thread that allocated it; a free is
counted exactly when its allocation was.  The counter keeps live bytes, the
overall peak and a resettable phase peak under one mutex, so allocations from
the main thread, intra-op threads and gloo's threads are neither lost nor
double-counted (selftest.py counter_concurrent_threads).  Optionally it logs
every alloc/free as (signed bytes, tag, live after, thread | category << 32),
so a trace can say which op, module and thread owns what is alive at the peak,
and which bytes gloo made that were left out.

Categories (see docs/oracle.md "What is not counted"):
  COUNTED      device memory on a GPU job
  EMULATED     scratch of a CPU kernel an emulation stands in for: the thread is
               inside `uncounted()` (per thread; intra-op workers of a parallel
               region follow the registered main thread)
  GLOO_THREAD  allocated on a thread that is neither a registered thread nor an
               intra-op worker inside a parallel region: gloo's work threads
               (ProcessGroupGloo::runLoop), which run AsyncAllgatherWork's
               `newLikeFlat(outputs[0])` flat output.  Counted unless
               set_foreign_counted(False) (emul's nccl_collectives does that)
  GLOO_CALL    allocated by the calling thread inside a gloo collective whose NCCL
               counterpart allocates nothing through the caching allocator: the
               c10d reduce-scatter and all-gather ops (found by a RecordFunction callback
               once set_collective_ops(True)): the reduce-scatter's input clones and the
               all-gather's flight-recorder newLikeFlat; or inside `collective()`
"""
import contextlib
import os

COUNTED, EMULATED, GLOO_THREAD, GLOO_CALL = 0, 1, 2, 3
CATEGORY = {COUNTED: "counted", EMULATED: "emulated", GLOO_THREAD: "gloo-thread", GLOO_CALL: "gloo-call"}

_SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {
constexpr size_t kHdr = 64;  // keeps c10's 64-byte alignment
enum Cat : int64_t { COUNTED = 0, EMULATED = 1, GLOO_THREAD = 2, GLOO_CALL = 3, NCAT = 4 };
// header: [0] bytes, [1] category, [2] tag, [3] thread index
struct Counter {
  int64_t live = 0, peak = 0, rpeak = 0, nalloc = 0;
  int64_t cat_live[NCAT] = {0, 0, 0, 0}, cat_peak[NCAT] = {0, 0, 0, 0}, cat_total[NCAT] = {0, 0, 0, 0};
  int64_t shadow_live = 0, shadow_peak = 0;   // counted + gloo's scratch: what a count without
                                              // the NCCL policy would see
};
std::mutex g_mu;                 // guards C and g_ev (compound updates: live and its peaks)
Counter C;
bool g_log = false;
std::vector<int64_t> g_ev;       // quadruples: signed bytes, tag, live after, thread | category << 32

std::atomic<int64_t> g_next_thread{1};
std::atomic<bool> g_main_uncounted{false};  // the registered main thread's state, for its intra-op workers
std::atomic<int64_t> g_main_tag{0};
std::atomic<bool> g_foreign_counted{true};
thread_local int64_t tl_thread = 0;         // 0: not seen yet
thread_local bool tl_registered = false;    // a thread whose allocations are its own (main, tests)
thread_local bool tl_main = false;
thread_local bool tl_uncounted = false;
thread_local bool tl_collective = false;
thread_local int64_t tl_tag = 0;

inline int64_t thread_index() {
  if (!tl_thread) tl_thread = g_next_thread.fetch_add(1);
  return tl_thread;
}

inline void note(int64_t b, int64_t tag, int64_t thread, int64_t cat) {
  if (g_log) { g_ev.push_back(b); g_ev.push_back(tag); g_ev.push_back(C.live); g_ev.push_back(thread | (cat << 32)); }
}

// category and tag of an allocation made now on this thread
inline Cat classify(int64_t* tag) {
  if (tl_registered) {
    *tag = tl_tag;
    if (tl_uncounted) return EMULATED;
    if (tl_collective) return GLOO_CALL;
    return COUNTED;
  }
  if (at::in_parallel_region()) {   // an intra-op worker: on behalf of the main thread
    *tag = g_main_tag.load(std::memory_order_relaxed);
    return g_main_uncounted.load(std::memory_order_relaxed) ? EMULATED : COUNTED;
  }
  *tag = tl_tag;
  if (tl_uncounted) return EMULATED;
  return g_foreign_counted.load(std::memory_order_relaxed) ? COUNTED : GLOO_THREAD;
}

void del(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHdr;
  int64_t* h = reinterpret_cast<int64_t*>(base);
  {
    std::lock_guard<std::mutex> g(g_mu);
    int64_t cat = h[1];
    C.cat_live[cat] -= h[0];
    if (cat == COUNTED) C.live -= h[0];
    if (cat == COUNTED || cat == GLOO_THREAD || cat == GLOO_CALL) C.shadow_live -= h[0];
    if (cat != EMULATED) note(-h[0], h[2], h[3], cat);
  }
  c10::free_cpu(base);
}
struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    char* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHdr));
    int64_t* h = reinterpret_cast<int64_t*>(base);
    int64_t tag = 0;
    Cat cat = classify(&tag);
    int64_t b = (int64_t)nbytes;
    h[0] = b;
    h[1] = cat;
    h[2] = tag;
    h[3] = thread_index();
    {
      std::lock_guard<std::mutex> g(g_mu);
      C.cat_live[cat] += b;
      C.cat_total[cat] += b;
      if (C.cat_live[cat] > C.cat_peak[cat]) C.cat_peak[cat] = C.cat_live[cat];
      if (cat == COUNTED) {
        C.live += b; C.nalloc++;
        if (C.live > C.peak) C.peak = C.live;
        if (C.live > C.rpeak) C.rpeak = C.live;
      }
      if (cat != EMULATED) {
        C.shadow_live += b;
        if (C.shadow_live > C.shadow_peak) C.shadow_peak = C.shadow_live;
        note(b, tag, h[3], cat);
      }
    }
    void* data = base + kHdr;
    return {data, data, &del, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
  void copy_data(void* d, const void* s, std::size_t n) const override { default_copy_data(d, s, n); }
};
CountingAllocator g_alloc;
std::atomic<bool> g_installed{false};

// c10d ops seen by a RecordFunction callback: every c10d:: op call is counted by name, and the
// ops whose gloo implementation allocates scratch on the calling thread run with tl_collective
// set (GLOO_CALL): ProcessGroupGloo::reduce_scatter_tensor_coalesced clones its inputs, and
// ProcessGroupGloo::enqueue records every all-gather in the flight recorder through
// AsyncAllgatherWork::getOutputTensors, a full-size newLikeFlat (see emul.py "collectives")
std::mutex g_calls_mu;
std::map<std::string, int64_t> g_calls;
std::atomic<bool> g_collective_ops{false};
struct CollCtx : public at::ObserverContext { bool old; };
std::unique_ptr<at::ObserverContext> coll_enter(const at::RecordFunction& fn) {
  const char* n = fn.name();
  if (!n || std::strncmp(n, "c10d::", 6) != 0) return nullptr;
  {
    std::lock_guard<std::mutex> g(g_calls_mu);
    g_calls[n]++;
  }
  if (!g_collective_ops.load(std::memory_order_relaxed)) return nullptr;
  static const char* const kGlooCall[] = {"c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_",
                                          "c10d::_allgather_base_", "c10d::allgather_",
                                          "c10d::allgather_into_tensor_coalesced_", "c10d::allgather_coalesced_"};
  bool hit = false;
  for (const char* k : kGlooCall) hit = hit || !std::strcmp(n, k);
  if (!hit) return nullptr;
  auto ctx = std::make_unique<CollCtx>();
  ctx->old = tl_collective;
  tl_collective = true;
  return ctx;
}
void coll_exit(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx) tl_collective = static_cast<CollCtx*>(ctx)->old;
}
bool g_callback = false;
}  // namespace

// count c10d op calls; on=true: gloo's caller-thread scratch in the ops above is GLOO_CALL
void set_collective_ops(bool on) {
  g_collective_ops = on;
  if (!g_callback) {
    g_callback = true;
    at::addGlobalCallback(at::RecordFunctionCallback(&coll_enter, &coll_exit)
                              .scopes({at::RecordScope::FUNCTION}).needsInputs(false));
  }
}
std::map<std::string, int64_t> collective_calls(bool reset) {
  std::lock_guard<std::mutex> g(g_calls_mu);
  std::map<std::string, int64_t> r = g_calls;
  if (reset) g_calls.clear();
  return r;
}

void install() { bool f = false; if (g_installed.compare_exchange_strong(f, true)) c10::SetCPUAllocator(&g_alloc, 100); }
bool installed() { return g_installed; }
// this thread's allocations are its own (not gloo's); main=true: also the thread whose state
// intra-op workers follow
int64_t register_thread(bool main) {
  tl_registered = true;
  if (main) { tl_main = true; g_main_uncounted = tl_uncounted; g_main_tag = tl_tag; }
  return thread_index();
}
int64_t thread_id() { return thread_index(); }
int64_t live() { std::lock_guard<std::mutex> g(g_mu); return C.live; }
int64_t peak() { std::lock_guard<std::mutex> g(g_mu); return C.peak; }
int64_t reset_peak() { std::lock_guard<std::mutex> g(g_mu); int64_t r = C.rpeak; C.rpeak = C.live; return r; }
int64_t region_peak() { std::lock_guard<std::mutex> g(g_mu); return C.rpeak; }
int64_t nalloc() { std::lock_guard<std::mutex> g(g_mu); return C.nalloc; }
// per category: (live, peak since reset_category_peaks, total allocated)
std::vector<int64_t> category_stats(int64_t cat) {
  std::lock_guard<std::mutex> g(g_mu);
  return {C.cat_live[cat], C.cat_peak[cat], C.cat_total[cat]};
}
void reset_category_peaks() {
  std::lock_guard<std::mutex> g(g_mu);
  for (int i = 0; i < NCAT; i++) { C.cat_peak[i] = C.cat_live[i]; C.cat_total[i] = 0; }
  C.shadow_peak = C.shadow_live;
}
int64_t shadow_peak() { std::lock_guard<std::mutex> g(g_mu); return C.shadow_peak; }
// selftest: nthreads registered threads allocate and free iters blocks each through c10's CPU
// allocator at once; returns {allocations made, counted bytes left live}
std::vector<int64_t> stress(int64_t nthreads, int64_t iters) {
  int64_t base = live();
  std::atomic<int64_t> made{0}, ready{0};
  std::vector<std::thread> ts;
  for (int64_t t = 0; t < nthreads; t++) {
    ts.emplace_back([&made, &ready, nthreads, iters]() {
      register_thread(false);
      c10::Allocator* a = c10::GetCPUAllocator();
      ready.fetch_add(1);
      while (ready.load() < nthreads) std::this_thread::yield();   // all start together
      for (int64_t i = 0; i < iters; i++) {
        c10::DataPtr d = a->allocate(64 + (i % 7) * 8);
        made.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  return {made.load(), live() - base};
}
bool set_uncounted(bool on) {
  bool o = tl_uncounted; tl_uncounted = on;
  if (tl_main) g_main_uncounted = on;
  return o;
}
bool set_collective(bool on) { bool o = tl_collective; tl_collective = on; return o; }
bool set_foreign_counted(bool on) { return g_foreign_counted.exchange(on); }
void set_log(bool on) { std::lock_guard<std::mutex> g(g_mu); g_log = on; g_ev.clear(); }
int64_t set_tag(int64_t t) { int64_t o = tl_tag; tl_tag = t; if (tl_main) g_main_tag = t; return o; }
std::vector<int64_t> take_log() { std::lock_guard<std::mutex> g(g_mu); std::vector<int64_t> r; r.swap(g_ev); return r; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install); m.def("installed", &installed);
  m.def("register_thread", &register_thread); m.def("thread_id", &thread_id);
  m.def("live", &live); m.def("peak", &peak); m.def("reset_peak", &reset_peak);
  m.def("region_peak", &region_peak); m.def("nalloc", &nalloc);
  m.def("category_stats", &category_stats); m.def("reset_category_peaks", &reset_category_peaks);
  m.def("shadow_peak", &shadow_peak);
  m.def("set_uncounted", &set_uncounted); m.def("set_collective", &set_collective);
  m.def("set_foreign_counted", &set_foreign_counted); m.def("set_log", &set_log);
  m.def("set_tag", &set_tag); m.def("take_log", &take_log);
  m.def("stress", &stress);
  m.def("set_collective_ops", &set_collective_ops); m.def("collective_calls", &collective_calls);
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
    """Build (cached) and return the extension, installed; the calling thread is the main one."""
    global _mod
    if _mod is None:
        from torch.utils.cpp_extension import load_inline
        _mod = load_inline(name="mmguard_memhook_v3", cpp_sources=[_SRC],
                           build_directory=build_dir(), extra_cflags=["-O2"], verbose=False)
        _mod.install()
        _mod.register_thread(True)
    return _mod


@contextlib.contextmanager
def uncounted():
    """Allocations of this thread inside (and their frees) are not counted."""
    old = _mod.set_uncounted(True)
    try:
        yield
    finally:
        _mod.set_uncounted(old)


@contextlib.contextmanager
def collective():
    """Allocations of this thread inside are gloo's collective scratch (GLOO_CALL): not counted."""
    old = _mod.set_collective(True)
    try:
        yield
    finally:
        _mod.set_collective(old)

#pragma once
// The runtime: the worker threads and the task queue that layers run on.
//
//   tilemoe::Runtime rt({.isa = "auto", .threads = 0});
//   auto t = layer.submit_forward(...);   // returns at once; runs on the runtime's threads
//   ... the GPU runs attention of the next micro-batch ...
//   rt.sync();                            // waits for every task submitted before; rethrows a failure
//
// Tasks run one at a time, in submission order (several layers may be queued). Synchronous calls
// (layer.forward(...)) take their place in the same order: after what is queued, before what is
// submitted later. Submits, waits and syncs may come from any thread.
//
// Errors: every call throws tilemoe::Error (tilemoe/error.hpp) with a message naming the layer,
// expert, file or argument; a failed call changes nothing. A task's error is thrown by the wait
// or sync that reports it; until then the tasks of the same layer queued after it do not run
// (they fail too, so that a backward never runs after its forward_sft failed).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

// Exported from libtilemoe.so, which hides everything else.
#if defined(__GNUC__)
#define TILEMOE_CXX_API __attribute__((visibility("default")))
#else
#define TILEMOE_CXX_API
#endif

namespace tilemoe {

struct RuntimeOptions {
  std::string isa = "auto";  // "auto" (AMX > AVX512-BF16 > AVX2 > portable; TILEMOE_ISA overrides), "amx", "avx512", "avx2", "portable"
  int threads = 0;           // worker threads; 0: one per core (TILEMOE_THREADS overrides)
};

class TILEMOE_CXX_API Runtime {
 public:
  using Ticket = std::uint64_t;

  // Throws Error(unsupported) when the ISA asked for cannot run on this CPU (AMX without AMX or
  // without Linux's permission for tiles), invalid_argument for an unknown name.
  explicit Runtime(const RuntimeOptions& options = {});
  ~Runtime();  // runs every queued task, then stops; destroy layers first
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Queues any task (the layers' submit_* calls use this too); returns at once.
  Ticket submit(std::function<void()> task);
  // Waits for one task; rethrows its error unless a sync reported it already.
  void wait(Ticket ticket);
  // Waits for every task submitted before this call; rethrows the first error among them that
  // was not reported yet.
  void sync();

  const char* isa() const;  // "amx", "avx512", "avx2" or "portable"
  int threads() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe

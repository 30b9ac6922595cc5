#pragma once
// What a Runtime holds, for the layers built on it.
#include "amx/isa.hpp"
#include "numa/thread_pool.hpp"
#include "src/api/task_queue.hpp"
#include "tilemoe/runtime.hpp"

namespace tilemoe {

struct Runtime::Impl {
  kernels::Isa isa;
  numa::ThreadPool* pool;  // shared by every runtime with the same thread count
  api::TaskQueue queue;
};

}  // namespace tilemoe

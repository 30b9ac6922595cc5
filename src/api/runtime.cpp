#include "tilemoe/runtime.hpp"

#include <utility>

#include "amx/kernel_table.hpp"
#include "src/api/runtime_impl.hpp"
#include "src/layer/moe_compute.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

Runtime::Runtime(const RuntimeOptions& options) {
  if (options.threads < 0) fail(ErrorKind::invalid_argument, "Runtime: threads must be >= 0 (0: one per core)");
  if (options.isa == "reference")
    fail(ErrorKind::invalid_argument, "Runtime: 'reference' is the checking path of the command line, not a runtime ISA; "
                                      "choose auto, amx, avx512 or portable");
  kernels::Isa isa = kernels::resolve_isa(options.isa == "auto" ? std::string_view{} : std::string_view{options.isa});
  kernels::kernel_table(isa);  // throws unsupported now rather than at the first call
  numa::ThreadPool& pool = pool_for_threads(options.threads);
  impl_ = std::unique_ptr<Impl>(new Impl{isa, &pool, {}});
}

Runtime::~Runtime() = default;

Runtime::Ticket Runtime::submit(std::function<void()> task) {
  if (!task) fail(ErrorKind::invalid_argument, "Runtime::submit: empty task");
  return impl_->queue.submit(std::move(task), nullptr);
}

void Runtime::wait(Ticket ticket) { impl_->queue.wait(ticket); }
void Runtime::sync() { impl_->queue.sync(); }
const char* Runtime::isa() const { return kernels::isa_name(impl_->isa); }
int Runtime::threads() const { return impl_->pool->size(); }

}  // namespace tilemoe

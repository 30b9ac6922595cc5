#include "tools/onednn_baseline.hpp"

#include <dnnl.hpp>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "src/layer/work_split.hpp"
#include "src/routing/token_groups.hpp"
#include "tilemoe/bf16.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::cli {

using dnnl::memory;

namespace {

// oneDNN's OpenMP threads inherit the affinity of the thread that starts them, and the bench pins
// its calling thread to one core: left so, all of oneDNN's threads would share that core. Every
// call into oneDNN runs with the caller allowed on every CPU, and the caller's mask is restored after.
class EveryCpuScope {
 public:
  EveryCpuScope() {
    ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    if (!ok_) return;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);  // the kernel keeps the CPUs that exist
  }
  ~EveryCpuScope() {
    if (ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  EveryCpuScope(const EveryCpuScope&) = delete;
  EveryCpuScope& operator=(const EveryCpuScope&) = delete;

 private:
  cpu_set_t saved_;
  bool ok_ = false;
};

}  // namespace

struct OnednnMoeBaseline::Impl {
  MoeShape shape;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // Y = X W^T with W [out][in]: oneDNN's weights are [in][out], i.e. W read as format_tag::ba.
  // The weights are reordered once into the layout oneDNN picks for a 64-row product; each row
  // count met at run time gets its own primitive on that same layout (made once, then reused).
  struct ProjectionMatmul {
    memory::dim in = 0, out = 0;
    int epilogue = 0;
    memory::desc weights_desc;
    std::vector<memory> weights;  // per expert
    std::map<memory::dim, dnnl::matmul> by_rows;
    std::string implementation;
  };
  ProjectionMatmul gate, up, down;
  // bf16, or f32 where oneDNN has no bf16 matmul (before AVX512-BF16: oneDNN 2.6 asks for it): the
  // products' inputs, the weights and h, in this type. x's rows are converted on their gather.
  memory::data_type dt = memory::data_type::bf16;
  std::vector<float> xs_f32, h_f32;
  std::vector<bf16> xs, h;
  std::vector<float> g, y, ys;

  // Post-ops: none (down), swish (gate: silu(x W^T)), or times an f32 [m][out] tensor with a bf16
  // result (up: silu(gate) * (x W^T), which is h).
  enum class Epilogue { none, swish, times_gate };

  dnnl::matmul::primitive_desc describe(memory::dim m, memory::dim in, memory::dim out, const memory::desc& wei, Epilogue epilogue) {
    const memory::desc src({m, in}, dt, memory::format_tag::ab);
    const memory::desc dst({m, out}, epilogue == Epilogue::times_gate ? dt : memory::data_type::f32,
                           memory::format_tag::ab);
    dnnl::post_ops ops;
    if (epilogue == Epilogue::swish) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
    if (epilogue == Epilogue::times_gate)
      ops.append_binary(dnnl::algorithm::binary_mul, memory::desc({m, out}, memory::data_type::f32, memory::format_tag::ab));
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), attr, engine);
  }

  ProjectionMatmul make(const ExpertWeightsView& w, tilemoe::Projection p, memory::dim in, memory::dim out, Epilogue epilogue) {
    ProjectionMatmul r;
    r.in = in;
    r.out = out;
    r.epilogue = static_cast<int>(epilogue);
    const auto pd = describe(64, in, out, memory::desc({in, out}, dt, memory::format_tag::any), epilogue);
    r.weights_desc = pd.weights_desc();
    r.implementation = pd.impl_info_str();
    for (int e = 0; e < w.shape.num_experts; ++e) {
      memory user({{in, out}, memory::data_type::bf16, memory::format_tag::ba}, engine, const_cast<bf16*>(w.projection(p, e)));
      memory packed(r.weights_desc, engine);
      dnnl::reorder(user, packed).execute(stream, user, packed);
      r.weights.push_back(packed);
    }
    stream.wait();
    return r;
  }

  // a: [m][in] in dt; c: f32 [m][out], or dt for times_gate, which multiplies by gate_f32 [m][out].
  void run(ProjectionMatmul& p, memory::dim m, int e, const void* a, void* c, const float* gate_f32 = nullptr) {
    const auto epilogue = static_cast<Epilogue>(p.epilogue);
    auto it = p.by_rows.find(m);
    if (it == p.by_rows.end()) it = p.by_rows.emplace(m, dnnl::matmul(describe(m, p.in, p.out, p.weights_desc, epilogue))).first;
    memory src({{m, p.in}, dt, memory::format_tag::ab}, engine, const_cast<void*>(a));
    memory dst({{m, p.out}, epilogue == Epilogue::times_gate ? dt : memory::data_type::f32, memory::format_tag::ab},
               engine, c);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, p.weights[static_cast<std::size_t>(e)]}, {DNNL_ARG_DST, dst}};
    if (epilogue == Epilogue::times_gate)
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                   memory({{m, p.out}, memory::data_type::f32, memory::format_tag::ab}, engine, const_cast<float*>(gate_f32)));
    it->second.execute(stream, args);
  }
};

OnednnMoeBaseline::OnednnMoeBaseline(const ExpertWeightsView& w) : impl_(std::make_unique<Impl>()) {
  EveryCpuScope every_cpu;
  Impl& s = *impl_;
  s.shape = w.shape;
  for (const memory::data_type dt : {memory::data_type::bf16, memory::data_type::f32}) {
    s.dt = dt;
    try {
      s.gate = s.make(w, tilemoe::Projection::gate, w.shape.hidden, w.shape.intermediate, Impl::Epilogue::swish);
      s.up = s.make(w, tilemoe::Projection::up, w.shape.hidden, w.shape.intermediate, Impl::Epilogue::times_gate);
      s.down = s.make(w, tilemoe::Projection::down, w.shape.intermediate, w.shape.hidden, Impl::Epilogue::none);
      return;
    } catch (const dnnl::error& e) {
      // unimplemented: no bf16 matmul on this CPU; the f32 one is what oneDNN offers a user here.
      if (dt == memory::data_type::bf16 && e.status == dnnl_unimplemented) continue;
      fail(ErrorKind::unsupported, std::string("oneDNN baseline (") + (dt == memory::data_type::bf16 ? "bf16" : "f32") + "): " + e.what());
    }
  }
}

OnednnMoeBaseline::~OnednnMoeBaseline() = default;
OnednnMoeBaseline::OnednnMoeBaseline(OnednnMoeBaseline&&) noexcept = default;

std::string OnednnMoeBaseline::implementation() const { return impl_->gate.implementation; }

std::string OnednnMoeBaseline::data_type() const { return impl_->dt == memory::data_type::bf16 ? "bf16" : "f32"; }

void OnednnMoeBaseline::forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* weights, float* out,
                                numa::ThreadPool& pool) {
  EveryCpuScope every_cpu;
  Impl& s = *impl_;
  const MoeShape& sh = s.shape;
  const std::size_t hidden = static_cast<std::size_t>(sh.hidden), inter = static_cast<std::size_t>(sh.intermediate);
  const TokenGroups groups = group_tokens_by_expert(ids, tokens, top_k, sh.num_experts);
  s.ys.resize(static_cast<std::size_t>(tokens) * top_k * hidden);
  for (int e = 0; e < sh.num_experts; ++e) {
    const int m = groups.count(e);
    if (m == 0) continue;
    const std::size_t rows = static_cast<std::size_t>(m), first = static_cast<std::size_t>(groups.offsets[e]);
    const bool f32 = s.dt == memory::data_type::f32;
    (f32 ? s.xs_f32.resize(rows * hidden) : s.xs.resize(rows * hidden));
    (f32 ? s.h_f32.resize(rows * inter) : s.h.resize(rows * inter));
    s.g.resize(rows * inter);
    s.y.resize(rows * hidden);
    pool.parallel_for(rows, [&](std::size_t i, int) {
      const bf16* row = x + static_cast<std::size_t>(groups.token[first + i]) * hidden;
      if (!f32) return void(std::memcpy(s.xs.data() + i * hidden, row, hidden * sizeof(bf16)));
      for (std::size_t c = 0; c < hidden; ++c) s.xs_f32[i * hidden + c] = bf16_to_float(row[c]);
    }, 16);
    const void* xs = f32 ? static_cast<const void*>(s.xs_f32.data()) : s.xs.data();
    void* h = f32 ? static_cast<void*>(s.h_f32.data()) : s.h.data();
    s.run(s.gate, m, e, xs, s.g.data());
    s.run(s.up, m, e, xs, h, s.g.data());
    s.run(s.down, m, e, h, s.y.data());
    s.stream.wait();
    pool.parallel_for(rows, [&](std::size_t i, int) {
      std::memcpy(s.ys.data() + static_cast<std::size_t>(groups.slot[first + i]) * hidden, s.y.data() + i * hidden, hidden * sizeof(float));
    }, 16);
  }
  combine_rows(pool, s.ys.data(), hidden, nullptr, hidden, tokens, top_k, ids, weights, out);
}

}  // namespace tilemoe::cli

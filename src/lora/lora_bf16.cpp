#include "src/lora/lora_weights.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe {

LayerLoraBf16 round_lora_to_bf16(const LayerLora& l) {
  LayerLoraBf16 out;
  for (int i = 0; i < 3; ++i) {
    const auto& s = l.proj[i];
    auto& d = out.proj[i];
    d.rank = s.rank;
    d.in = s.in;
    d.out = s.out;
    d.a.resize(s.a.size());
    d.b.resize(s.b.size());
    for (std::size_t k = 0; k < s.a.size(); ++k) d.a[k] = float_to_bf16(s.a[k]);
    for (std::size_t k = 0; k < s.b.size(); ++k) d.b[k] = float_to_bf16(s.b[k]);
    d.scale = s.scale;
    d.present = s.present;
    d.expert_rank = s.expert_rank;
  }
  return out;
}

}  // namespace tilemoe

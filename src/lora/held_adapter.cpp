#include "src/lora/held_adapter.hpp"

#include <string>
#include <utility>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe {

bool stored_as_bf16(const LoadedLora& loaded) {
  bool any = false;
  for (Projection p : kProjections) {
    const int i = static_cast<int>(p);
    const auto& proj = loaded.lora[p];
    if (proj.rank == 0) continue;
    const auto& da = loaded.dtype_a[i];
    const auto& db = loaded.dtype_b[i];
    const std::size_t experts = proj.present.size();
    if (da.size() != experts || db.size() != experts) return false;
    for (std::size_t e = 0; e < experts; ++e) {
      if (!proj.present[e]) continue;
      if (da[e] != io::Dtype::BF16 || db[e] != io::Dtype::BF16) return false;
      any = true;
    }
  }
  return any;
}

HeldAdapter::HeldAdapter(LoadedLora loaded, AdapterStorage storage) : loaded_(std::move(loaded)) {
  const bool bf16 = storage == AdapterStorage::bf16 || (storage == AdapterStorage::as_stored && stored_as_bf16(loaded_));
  if (!bf16) {
    view_ = lora_view(loaded_.lora);
    return;
  }
  bf16_ = round_lora_to_bf16(loaded_.lora);  // as_stored: exact, every value came from a bf16
  // An f32 value above bf16's largest finite one rounds to infinity: refused, the expert named,
  // before the layer holds anything of this adapter.
  for (Projection p : kProjections) {
    const auto& proj = bf16_[p];
    auto check = [&](const std::vector<std::uint16_t>& held, const std::vector<float>& source, std::size_t per_expert,
                     const char* factor) {
      for (std::size_t i = 0; i < held.size(); ++i)
        if (!bf16_is_finite(held[i]))
          fail(ErrorKind::invalid_argument, std::string("adapter: LoRA ") + factor + " of " + projection_name(p) + ", expert " +
                                                std::to_string(i / per_expert) + ": " + std::to_string(source[i]) +
                                                " is beyond bf16's range; hold the adapter as f32 (AdapterStorage::f32 or "
                                                "as_stored)");
    };
    check(proj.a, loaded_.lora[p].a, static_cast<std::size_t>(proj.rank) * proj.in, "A");
    check(proj.b, loaded_.lora[p].b, static_cast<std::size_t>(proj.out) * proj.rank, "B");
  }
  loaded_.lora = LayerLora{};  // the f32 copy is not kept
  view_ = lora_view(bf16_);
}

LayerPeftStackedKeys HeldAdapter::stacked_keys() const {
  LayerPeftStackedKeys out;
  for (int i = 0; i < 3; ++i) {
    const auto& k = loaded_.stacked[i];
    out[i] = {k.key_a, k.key_b, k.first_row, k.b_rows, k.row_step};
  }
  return out;
}

const std::vector<int>& HeldAdapter::expert_rank(Projection p) const {
  return dtype() == LoraDType::bf16 ? bf16_[p].expert_rank : loaded_.lora[p].expert_rank;
}

std::size_t HeldAdapter::factor_bytes() const {
  std::size_t bytes = 0;
  for (int i = 0; i < 3; ++i)
    bytes += (loaded_.lora.proj[i].a.size() + loaded_.lora.proj[i].b.size()) * sizeof(float) +
             (bf16_.proj[i].a.size() + bf16_.proj[i].b.size()) * sizeof(std::uint16_t);
  return bytes;
}

}  // namespace tilemoe

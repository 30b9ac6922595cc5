#include "src/model/tensor_names.hpp"

#include <charconv>
#include <vector>

namespace tilemoe {
namespace {

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::optional<int> parse_index(std::string_view token) {
  if (token.empty() || token.size() > 9) return std::nullopt;
  int value = 0;
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || ptr != token.data() + token.size() || value < 0) return std::nullopt;
  return value;
}

std::optional<Projection> parse_projection(std::string_view t) {
  if (t == "gate_proj" || t == "w1") return Projection::gate;
  if (t == "up_proj" || t == "w3") return Projection::up;
  if (t == "down_proj" || t == "w2") return Projection::down;
  return std::nullopt;
}

std::optional<StackedExperts> parse_stacked_kind(std::string_view t) {
  if (t == "gate_up_proj") return StackedExperts::gate_up;
  if (t == "gate_proj" || t == "w1") return StackedExperts::gate;
  if (t == "up_proj" || t == "w3") return StackedExperts::up;
  if (t == "down_proj" || t == "w2") return StackedExperts::down;
  return std::nullopt;
}

}  // namespace

std::optional<int> parse_layer_index(std::string_view name) {
  auto parts = split_dots(name);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers") return parse_index(parts[i + 1]);
  }
  return std::nullopt;
}

std::optional<ExpertTensorName> parse_expert_tensor_name(std::string_view name) {
  auto parts = split_dots(name);
  // Find "experts.E.<proj>" after "layers.L"; the trailing part is "weight" or
  // "lora_A[.<adapter name>].weight", or the same with "bias".
  std::optional<int> layer;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers" && !layer) {
      layer = parse_index(parts[i + 1]);
      continue;
    }
    if (!layer || parts[i] != "experts" || i + 3 >= parts.size()) continue;
    auto expert = parse_index(parts[i + 1]);
    if (!expert) continue;
    auto proj = parse_projection(parts[i + 2]);
    if (!proj) continue;
    std::size_t rest = i + 3;
    ExpertTensorName out;
    out.layer = *layer;
    out.expert = *expert;
    out.projection = *proj;
    out.projection_token = std::string(parts[i + 2]);
    std::size_t remaining = parts.size() - rest;
    out.bias = parts.back() == "bias";
    if (remaining == 1 && (parts[rest] == "weight" || out.bias)) return out;
    if ((remaining == 2 || remaining == 3) && (parts.back() == "weight" || out.bias) &&
        (parts[rest] == "lora_A" || parts[rest] == "lora_B")) {
      out.lora = parts[rest] == "lora_A" ? LoraFactor::a : LoraFactor::b;
      return out;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<StackedExpertTensorName> parse_stacked_expert_tensor_name(std::string_view name) {
  auto parts = split_dots(name);
  std::optional<int> layer;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers" && !layer) {
      layer = parse_index(parts[i + 1]);
      continue;
    }
    // GraniteMoE: "...block_sparse_moe.input_linear.weight" [E, 2I, H] (gate's rows, then up's) and
    // "...block_sparse_moe.output_linear.weight" [E, H, I].
    if (layer && i > 0 && parts[i - 1] == "block_sparse_moe" && (parts[i] == "input_linear" || parts[i] == "output_linear")) {
      if (i + 2 != parts.size() || (parts.back() != "weight" && parts.back() != "bias")) return std::nullopt;
      StackedExpertTensorName out;
      out.layer = *layer;
      out.kind = parts[i] == "input_linear" ? StackedExperts::gate_up : StackedExperts::down;
      out.bias = parts.back() == "bias";
      out.projection_token = std::string(parts[i]);
      return out;
    }
    if (!layer || parts[i] != "experts") continue;
    const std::size_t remaining = parts.size() - (i + 1);
    if (remaining > 2 || (remaining == 2 && parts.back() != "weight" && parts.back() != "bias")) return std::nullopt;
    std::string_view token = parts[i + 1];
    StackedExpertTensorName out;
    out.layer = *layer;
    out.bias = remaining == 2 && parts.back() == "bias";
    // gpt-oss writes its biases as "experts.gate_up_proj_bias".
    constexpr std::string_view kBiasSuffix = "_bias";
    if (remaining == 1 && token.size() > kBiasSuffix.size() && token.substr(token.size() - kBiasSuffix.size()) == kBiasSuffix) {
      token = token.substr(0, token.size() - kBiasSuffix.size());
      out.bias = true;
    }
    auto kind = parse_stacked_kind(token);
    if (!kind) return std::nullopt;
    out.kind = *kind;
    out.projection_token = std::string(token);
    return out;
  }
  return std::nullopt;
}

std::optional<StackedLoraName> parse_stacked_lora_name(std::string_view name) {
  auto parts = split_dots(name);
  std::optional<int> layer;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers" && !layer) {
      layer = parse_index(parts[i + 1]);
      continue;
    }
    if (!layer || parts[i] != "experts") continue;
    std::size_t j = i + 1;
    while (j < parts.size() && parts[j] == "base_layer") ++j;
    if (j >= parts.size() || (parts[j] != "lora_A" && parts[j] != "lora_B")) return std::nullopt;
    const std::size_t remaining = parts.size() - j;  // lora_X [adapter] weight|bias
    if ((remaining != 2 && remaining != 3) || (parts.back() != "weight" && parts.back() != "bias")) return std::nullopt;
    StackedLoraName out;
    out.layer = *layer;
    out.factor = parts[j] == "lora_A" ? LoraFactor::a : LoraFactor::b;
    out.bias = parts.back() == "bias";
    for (std::size_t k = 0; k < j; ++k) {
      if (k) out.pair_key += '.';
      out.pair_key += parts[k];
      if (parts[k] == "base_layer") continue;
      if (!out.module.empty()) out.module += '.';
      out.module += parts[k];
    }
    constexpr std::string_view kPeftPrefix = "base_model.model.";
    if (out.module.rfind(kPeftPrefix, 0) == 0) out.module.erase(0, kPeftPrefix.size());
    return out;
  }
  return std::nullopt;
}

std::string expert_key_template(std::string_view name, int expert) {
  std::string needle = ".experts." + std::to_string(expert) + ".";
  std::size_t pos = name.find(needle);
  if (pos == std::string_view::npos) return std::string(name);
  std::string out(name.substr(0, pos));
  out += ".experts.{E}.";
  out += name.substr(pos + needle.size());
  return out;
}

std::string expand_expert_key_template(std::string_view key_template, int expert) {
  std::string out(key_template);
  std::size_t pos = out.find("{E}");
  if (pos != std::string::npos) out.replace(pos, 3, std::to_string(expert));
  return out;
}

}  // namespace tilemoe

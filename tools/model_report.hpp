#pragma once
// `tilemoe info --model DIR`: what tilemoe reads of a Hugging Face checkpoint before a user loads
// hundreds of GB of it: the MoE shape and layers, where each MoE layer's experts and router are
// stored, and whether the checkpoint's router is one tilemoe computes (and if not, why).
#include <string>

namespace tilemoe::cli {

// Prints the report as text or one JSON object; returns 0 when every MoE layer's experts and
// router read, 1 when some layer's do not (the report says which and why). A config.json tilemoe
// refuses throws, as every command that reads the model does.
int print_model_report(const std::string& model_dir, bool json);

}  // namespace tilemoe::cli

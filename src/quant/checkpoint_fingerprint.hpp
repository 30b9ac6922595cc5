#pragma once
// Identifies the checkpoint a quantized model was made from, so that loading it next to the
// wrong model can be refused.
#include <string>

namespace tilemoe {
class Checkpoint;
}

namespace tilemoe::quant {

// "fnv1a64:<16 hex digits>" over config.json's bytes and every shard's safetensors header (file
// name, and per tensor its name, dtype, shape and data offsets; the file's __metadata__). The
// weight bytes are not read: hashing tens or hundreds of GB would take minutes, and a checkpoint
// whose tensors keep their names, types, shapes and places but change values is rare enough
// not to pay that for. The hash identifies; it does not authenticate.
std::string checkpoint_fingerprint(const Checkpoint& ck);

}  // namespace tilemoe::quant

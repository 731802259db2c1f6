// Rung 06 at head dim 128, bf16 and fp16 (rung06.cuh), registered when the extension loads.
#include "rung06.cuh"

namespace {
const ladder_torch::Registrar kD128 = ladder_torch::rung06::register_dim<128>();
}  // namespace

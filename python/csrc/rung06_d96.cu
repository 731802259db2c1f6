// Rung 06 at head dim 96, bf16 and fp16 (rung06.cuh), registered when the extension loads.
#include "rung06.cuh"

namespace {
const ladder_torch::Registrar kD96 = ladder_torch::rung06::register_dim<96>();
}  // namespace

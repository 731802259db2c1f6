// Rung 06 at head dim 32, bf16 and fp16 (rung06.cuh), registered when the extension loads.
#include "rung06.cuh"

namespace {
const ladder_torch::Registrar kD32 = ladder_torch::rung06::register_dim<32>();
}  // namespace

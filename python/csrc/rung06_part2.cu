// Rung 06, part 2 of rung06.cuh's kParts: its head dims, bf16 and fp16, registered when the
// extension loads.
#include "rung06.cuh"

namespace {
const bool kPart2 = ladder_torch::rung06::register_part<2>();
}  // namespace

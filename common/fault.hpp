// Fault builds: tests/fault.sh builds each GPU rung's harness a second time with LADDER_FAULT
// defined, which plants one plausible defect in that rung (03: the softmax scale 0.5 % off;
// 04: the causal diagonal one key too far; 05: the forward's scale 0.5 % off; 06: the exp2
// scale 0.5 % off in bf16 only). The harness must fail that build: it is how the ladder shows
// that its rule catches a wrong kernel on the GPU too, not only the mutants of the oracle
// (tests/test_mutants.cpp). The default build has kFault = false, and every use folds away.
#pragma once

namespace ladder {

#ifdef LADDER_FAULT
inline constexpr bool kFault = true;
#else
inline constexpr bool kFault = false;
#endif

// The rescale fault (rungs 06 and 07, tests/fault.sh NN rescale): the online softmax's rescale
// computed as exp2(m_old c - fl(m_new c)) instead of exp2((m_old - m_new) c). It is 2^eps, not
// 1, when the row max holds, so l and LSE drift with the number of key tiles; the harness's
// cases at scale must fail it.
#ifdef LADDER_FAULT_RESCALE
inline constexpr bool kFaultRescale = true;
#else
inline constexpr bool kFaultRescale = false;
#endif

}  // namespace ladder

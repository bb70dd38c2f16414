// Placeholder until the checkpoint service lands: no state file, no thread.
#include "tests/support/cuda/fake/fake_gate.h"
#include "tests/support/cuda/fake/fake_libcuda.h"

namespace gpumigrate::cuda::fake {

void StartService() {}
void PublishGate(CUprocessState, const GateCounters&) {}

}  // namespace gpumigrate::cuda::fake

// What this kernel's userfaultfd offers: one probe for the engine
// (ProbeKernelTracking, to choose a dirty tracker) and the shim (to set up the
// session's write-protect). It opens a throwaway user-mode-only userfaultfd and
// asks UFFDIO_API for no features, which answers with every feature it has.
//
// Depends on nothing else of the engine, so libgpumigrate_shim compiles it too
// (CMakeLists.txt, gpumigrate_shim). Thread-safe; costs two syscalls and a close.
#pragma once

#include <cstdint>

namespace gpumigrate::proc {

struct UffdProbe {
  uint64_t features = 0;               // what UFFDIO_API offers; 0 when a call failed
  int error = 0;                       // errno of the call that failed, 0 when none did
  const char* failed_call = nullptr;   // "userfaultfd" or "UFFDIO_API", nullptr when none failed
  bool ok() const { return failed_call == nullptr; }
};

UffdProbe ProbeUffdFeatures();

}  // namespace gpumigrate::proc

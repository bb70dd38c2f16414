// The one tokenizer behind the device specs the CLI takes:
//   "sim:size=4GiB,kv=0.3"   "proc:1234,tracker=hash"   "sim:llm"
// It splits "kind:token,token,..." and each token at its first '=' and knows no
// keys; each backend's parser (ParseSimSpec, ParseProcSpec) gives them meaning.
// Pure, no I/O; the views borrow from the text passed in, which must outlive them.
#pragma once

#include <string_view>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct SpecToken {
  std::string_view key;    // the text before the first '=', or the whole token
  std::string_view value;  // the text after it; empty when there is none
  bool has_value = false;  // the token is key=value
};

struct SplitSpec {
  std::string_view kind;          // before the first ':'; the whole text when there is none
  std::vector<SpecToken> tokens;  // after it, split at ','; empty tokens ("a,,b", "a,") dropped
};

// Fails (InvalidArgument, naming the token and the spec) only on a token with
// an '=' but no key ("=5"); whether a bare token or a key is allowed is the
// caller's to say.
Result<SplitSpec> SplitDeviceSpec(std::string_view text);

}  // namespace gpumigrate

// Reading a --plot script in tests: the lines of one of its data blocks.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace gpumigrate::cli {

// The lines of the data block NAME ("$NAME << EOD" ... "EOD").
inline std::vector<std::string> Block(const std::string& script, const std::string& name) {
  std::istringstream in(script);
  std::vector<std::string> lines;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "$" + name + " << EOD") {
      inside = true;
    } else if (inside && line == "EOD") {
      return lines;
    } else if (inside) {
      lines.push_back(line);
    }
  }
  ADD_FAILURE() << "no data block $" << name;
  return lines;
}

}  // namespace gpumigrate::cli

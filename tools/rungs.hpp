// Every rung of the ladder in order, and whether this build has it (tools/rungs.cpp).
#pragma once
#include <string>
#include <vector>

#include "step.hpp"

namespace ladder {

struct Rung {
  int number;
  std::string name;
  const Step* step;       // null when the rung was not built
  std::string not_built;  // why, when step is null
};

const std::vector<Rung>& rungs();
const Step* find_step(int number);  // null if unknown or not built

}  // namespace ladder

#include "tensor.hpp"

#include <sstream>

namespace ladder {

std::string Tensor::shape_str() const {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::vector<float> to_float(const Tensor& t) {
  return std::vector<float>(t.data.begin(), t.data.end());
}

}  // namespace ladder

#include "step.hpp"

#include <algorithm>
#include <sstream>

namespace ladder {

std::string Step::unsupported(const Problem& p, const std::string& variant) const {
  std::ostringstream e;
  for (const Variant& v : variants) {
    if (v.name != variant) continue;
    const bool dtype_ok =
        v.dtypes.empty() || std::find(v.dtypes.begin(), v.dtypes.end(), p.dtype) != v.dtypes.end();
    const bool dim_ok = v.head_dims.empty() || std::find(v.head_dims.begin(), v.head_dims.end(),
                                                         p.dim) != v.head_dims.end();
    if (dtype_ok && dim_ok) break;
    e << "variant '" << v.name << "' of step " << name << " is built for";
    for (DType t : (v.dtypes.empty() ? caps.dtypes : v.dtypes)) e << " " << dtype_name(t);
    e << " with --dim";
    for (int64_t d : (v.head_dims.empty() ? caps.head_dims : v.head_dims)) e << " " << d;
    e << " only (the default variant '" << variants.front().name << "' covers "
      << capabilities_str() << ")";
    return e.str();
  }
  if (std::find(caps.dtypes.begin(), caps.dtypes.end(), p.dtype) == caps.dtypes.end()) {
    e << "step " << name << " does not support dtype " << dtype_name(p.dtype) << "; it supports";
    for (DType t : caps.dtypes) e << " " << dtype_name(t);
    return e.str();
  }
  if (!caps.head_dims.empty() &&
      std::find(caps.head_dims.begin(), caps.head_dims.end(), p.dim) == caps.head_dims.end()) {
    e << "step " << name << " does not support --dim " << p.dim << "; it supports";
    for (int64_t d : caps.head_dims) e << " " << d;
    return e.str();
  }
  if (caps.head_dims.empty() && caps.max_dim > 0 && p.dim > caps.max_dim) {
    e << "step " << name << " supports --dim up to " << caps.max_dim << ", got " << p.dim;
    return e.str();
  }
  if (p.causal && !caps.causal) return "step " + name + " does not support --causal";
  if (p.heads != p.heads_kv && !caps.gqa)
    return "step " + name + " does not support GQA (--heads-kv must equal --heads)";
  if (p.backward && !caps.backward) return "step " + name + " has no backward pass";
  if (p.backward && !backward_supports(p.dim)) {
    e << "step " << name << "'s backward supports --dim";
    for (int64_t d : caps.backward_head_dims) e << " " << d;
    e << " (the forward also " << (caps.head_dims.empty() ? "others" : "the rest of its dims")
      << ")";
    return e.str();
  }
  return "";
}

std::string Step::unknown_variant(const std::string& v) const {
  if (v.empty()) return "";
  for (const Variant& x : variants)
    if (x.name == v) return "";
  std::ostringstream e;
  e << "step " << name << " has no variant '" << v << "'; its variants are:";
  for (const Variant& x : variants) e << " " << x.name;
  return e.str();
}

std::string Step::capabilities_str() const {
  std::ostringstream s;
  for (size_t i = 0; i < caps.dtypes.size(); ++i) s << (i ? "/" : "") << dtype_name(caps.dtypes[i]);
  s << ", d ";
  if (caps.head_dims.empty()) {
    s << (caps.max_dim ? "<= " + std::to_string(caps.max_dim) : "any");
  } else {
    for (size_t i = 0; i < caps.head_dims.size(); ++i) s << (i ? "," : "") << caps.head_dims[i];
  }
  if (caps.causal) s << ", causal";
  if (caps.gqa) s << ", GQA";
  s << (caps.backward ? ", fwd+bwd" : ", fwd only");
  if (caps.backward && !caps.backward_head_dims.empty()) {
    s << " (bwd d ";
    for (size_t i = 0; i < caps.backward_head_dims.size(); ++i)
      s << (i ? "," : "") << caps.backward_head_dims[i];
    s << ")";
  }
  return s.str();
}

bool Step::backward_supports(int64_t d) const {
  return caps.backward && (caps.backward_head_dims.empty() ||
                           std::find(caps.backward_head_dims.begin(), caps.backward_head_dims.end(),
                                     d) != caps.backward_head_dims.end());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ladder

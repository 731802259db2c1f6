#include "step.hpp"

#include <algorithm>
#include <sstream>
#include <utility>

#include "error.hpp"

namespace ladder {

namespace {
template <class T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string dims_str(const std::vector<int64_t>& dims, const char* sep = " ") {
  std::ostringstream s;
  for (size_t i = 0; i < dims.size(); ++i) s << (i ? sep : "") << dims[i];
  return s.str();
}

std::string dtypes_str(const std::vector<DType>& ts, const char* sep = " ") {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? sep : "") + std::string(dtype_name(ts[i]));
  return s;
}
}  // namespace

const Variant* Step::find_variant(const std::string& v) const {
  if (v.empty()) return &variants.front();
  for (const Variant& x : variants)
    if (x.name == v) return &x;
  return nullptr;
}

namespace {
// Why the step (and variant v) cannot run p, from the capabilities alone; empty if it can.
std::string capability_gap(const Step& s, const Variant& v, const Problem& p) {
  const Capabilities& caps = s.caps;
  const std::string& name = s.name;
  const std::string& dflt = s.variants.front().name;
  if (!contains(caps.dtypes, p.dtype))
    return "step " + name + " does not support --dtype " + dtype_name(p.dtype) + "; it supports " +
           dtypes_str(caps.dtypes);
  if (!caps.head_dims.empty() && !contains(caps.head_dims, p.dim))
    return "step " + name + " does not support --dim " + std::to_string(p.dim) + "; it supports " +
           dims_str(caps.head_dims);
  if (caps.head_dims.empty() && caps.max_dim > 0 && p.dim > caps.max_dim)
    return "step " + name + " supports --dim up to " + std::to_string(caps.max_dim) + ", got " +
           std::to_string(p.dim);
  const bool v_dtype = v.dtypes.empty() || contains(v.dtypes, p.dtype);
  const bool v_dim = v.head_dims.empty() || contains(v.head_dims, p.dim);
  if (!v_dtype || !v_dim) {
    std::ostringstream e;
    e << "variant '" << v.name << "' of step " << name << " is built for "
      << dtypes_str(v.dtypes.empty() ? caps.dtypes : v.dtypes) << " with --dim "
      << dims_str(v.head_dims.empty() ? caps.head_dims : v.head_dims)
      << " only (the default variant '" << dflt << "' covers " << s.capabilities_str() << ")";
    return e.str();
  }
  if (p.causal && !caps.causal) return "step " + name + " does not support --causal";
  if (p.heads != p.heads_kv && !caps.gqa)
    return "step " + name + " does not support GQA (--heads-kv must equal --heads)";
  if (p.backward && !caps.backward) return "step " + name + " has no backward pass";
  if (p.backward && !s.backward_supports(p.dim))
    return "step " + name + "'s backward supports --dim " + dims_str(caps.backward_head_dims) +
           " (its forward also runs --dim " + std::to_string(p.dim) + ")";
  if (p.backward && !v.backward)
    return "variant '" + v.name + "' of step " + name + " has no backward pass (the default '" +
           dflt + "' has)";
  if (p.dropout > 0 && !caps.dropout)
    return "step " + name + " does not support --dropout (rungs with dropout: see `ladder list`)";
  if (p.sparsity.active() && !caps.block_sparse)
    return "step " + name +
           " does not support block-sparse masks (rungs with them: see `ladder list`)";
  if ((p.dropout > 0 && !v.dropout) || (p.sparsity.active() && !v.block_sparse))
    return "variant '" + v.name + "' of step " + name + " has no " +
           (p.dropout > 0 && !v.dropout ? "dropout" : "block-sparse masks") +
           " (the default variant '" + dflt + "' has)";
  auto limit = [&](const char* flag, int64_t x, int64_t max) -> std::string {
    if (max > 0 && x > max)
      return "step " + name + " supports " + flag + " up to " + std::to_string(max) + ", got " +
             std::to_string(x);
    return "";
  };
  for (const std::string& why :
       {limit("--batch", p.batch, caps.max_batch), limit("--heads", p.heads, caps.max_heads),
        limit("--seq-q", p.seq_q, caps.max_seq), limit("--seq-k", p.seq_k, caps.max_seq)})
    if (!why.empty()) return why;
  return "";
}
}  // namespace

RunOptions Step::resolve(const Problem& p, const RunOptions& o, const DeviceInfo& dev) const {
  const Variant* v = find_variant(o.variant);
  if (!v) {
    std::ostringstream e;
    e << "step " << name << " has no variant '" << o.variant << "'; its variants are:";
    for (const Variant& x : variants) e << " " << x.name;
    throw BadInput(e.str());
  }
  if (const std::string why = capability_gap(*this, *v, p); !why.empty()) throw BadInput(why);
  RunOptions r = o;
  r.variant = v->name;
  r.device = dev;
  if (!tiles) {
    if (o.tile_q != 0 || o.tile_k != 0)
      throw BadInput("step " + name + " is not tiled: --tile-q and --tile-k do not apply to it");
    return r;
  }
  const Tiles t = tiles(p, r, dev);
  // A block mask is applied a tile at a time: each tile must lie inside one mask block.
  // Without a device a tile may be unknown yet (0): the known one is checked alone.
  if (p.sparsity.active() &&
      ((t.q > 0 && p.sparsity.block_q % t.q != 0) || (t.k > 0 && p.sparsity.block_k % t.k != 0)))
    throw BadInput("step " + name + " runs " +
                   (t.q > 0 ? "Br x Bc = " + std::to_string(t.q) + "x" + std::to_string(t.k)
                            : "Bc = " + std::to_string(t.k) + "-key") +
                   " tiles here, which must divide the mask block (--mask-block " +
                   std::to_string(p.sparsity.block_q) + "x" + std::to_string(p.sparsity.block_k) +
                   "): use a mask block that is a multiple of them");
  r.tile_q = t.q, r.tile_k = t.k;
  return r;
}

std::string Step::unsupported(const Problem& p, const RunOptions& o) const {
  try {
    resolve(p, o, DeviceInfo{});
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

std::string Step::wrong_device(const DeviceInfo& dev) const {
  if (device != Device::cuda) return "";
  const bool low = caps.min_cc > 0 && dev.cc < caps.min_cc;
  const bool high = caps.max_cc > 0 && dev.cc > caps.max_cc;
  if (!low && !high) return "";
  auto cc = [](int x) { return std::to_string(x / 10) + "." + std::to_string(x % 10); };
  return "step " + name + " runs on GPUs of compute capability " + cc(caps.min_cc) +
         (caps.max_cc == caps.min_cc ? ""
          : caps.max_cc              ? " to " + cc(caps.max_cc)
                                     : " or newer") +
         " only (this one, " + dev.name + ", is " + cc(dev.cc) + ")";
}

std::string Step::capabilities_str() const {
  std::ostringstream s;
  s << dtypes_str(caps.dtypes, "/") << ", d ";
  if (caps.head_dims.empty())
    s << (caps.max_dim ? "<= " + std::to_string(caps.max_dim) : "any");
  else
    s << dims_str(caps.head_dims, ",");
  if (caps.causal) s << ", causal";
  if (caps.gqa) s << ", GQA";
  s << (caps.backward ? ", fwd+bwd" : ", fwd only");
  if (caps.backward && !caps.backward_head_dims.empty())
    s << " (bwd d " << dims_str(caps.backward_head_dims, ",") << ")";
  if (caps.dropout) s << ", dropout";
  if (caps.block_sparse) s << ", block-sparse";
  if (caps.min_cc > 0) s << ", sm_" << caps.min_cc << (caps.max_cc == caps.min_cc ? " only" : "+");
  return s.str();
}

bool Step::backward_supports(int64_t d) const {
  return caps.backward && (caps.backward_head_dims.empty() || contains(caps.backward_head_dims, d));
}

StepBuilder::StepBuilder(int number, std::string name, Device device, std::string summary) {
  step_.number = number;
  step_.name = std::move(name);
  step_.device = device;
  step_.summary = std::move(summary);
}
StepBuilder& StepBuilder::adds(std::vector<std::string> ideas) {
  step_.adds = std::move(ideas);
  return *this;
}
StepBuilder& StepBuilder::dtypes(std::vector<DType> ts) {
  step_.caps.dtypes = std::move(ts);
  return *this;
}
StepBuilder& StepBuilder::head_dims(std::vector<int64_t> dims) {
  step_.caps.head_dims = std::move(dims);
  return *this;
}
StepBuilder& StepBuilder::max_dim(int64_t d) {
  step_.caps.max_dim = d;
  return *this;
}
StepBuilder& StepBuilder::backward(std::vector<int64_t> dims) {
  step_.caps.backward = true;
  step_.caps.backward_head_dims = std::move(dims);
  return *this;
}
StepBuilder& StepBuilder::dropout() {
  step_.caps.dropout = true;
  return *this;
}
StepBuilder& StepBuilder::block_sparse() {
  step_.caps.block_sparse = true;
  return *this;
}
StepBuilder& StepBuilder::max_sizes(int64_t batch, int64_t heads, int64_t seq) {
  step_.caps.max_batch = batch, step_.caps.max_heads = heads, step_.caps.max_seq = seq;
  return *this;
}
StepBuilder& StepBuilder::compute_capability(int min_cc, int max_cc) {
  step_.caps.min_cc = min_cc, step_.caps.max_cc = max_cc;
  return *this;
}
StepBuilder& StepBuilder::limits(std::string words) {
  step_.caps.limits = std::move(words);
  return *this;
}
StepBuilder& StepBuilder::variants(std::vector<Variant> vs) {
  step_.variants = std::move(vs);
  return *this;
}
StepBuilder& StepBuilder::tiles(
    std::function<Tiles(const Problem&, const RunOptions&, const DeviceInfo&)> f) {
  step_.tiles = std::move(f);
  return *this;
}
StepBuilder& StepBuilder::workspace(std::function<double(const Problem&, const RunOptions&)> f) {
  step_.workspace = std::move(f);
  return *this;
}
StepBuilder& StepBuilder::run(RunFn f) {
  step_.run = std::move(f);
  return *this;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ladder

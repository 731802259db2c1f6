// Step 02 — online softmax (CPU, fp32).
// Adds: online (m, l), the sum corrected as the max grows; one-pass recurrence with unnormalised O;
// one division at the end; tiled Br x Bc form (FlashAttention pseudocode); block-sparse masks,
// skipped a tile at a time; dropout regenerated from a counter-based generator, never stored.
//
// Where it sits: after 01's three passes over each row of S. The online softmax
// (Milakov & Gimelshein, 2018) keeps a running max m and a running sum l, and corrects the
// sum whenever the max grows, so max and sum take one pass. Folding P.V into the same pass
// gives the recurrence FlashAttention is built on: O is kept unnormalised, corrected the same
// way, and divided once at the end. notes/02_online_softmax.md derives the update and proves it
// exact. Three variants:
//   two-pass:  pass 1 (m, l) online; pass 2 O_i from the final m_i and l_i
//   one-pass:  one loop over the keys with running m, l and unnormalised O
//   tiled:     the one-pass recurrence over Br x Bc blocks of S, in the names of the
//              FlashAttention-2 pseudocode (Q_i, K_j, V_j, m_i, l_i, Tr, Tc): the GPU
//              tiling of step 05, first seen on the CPU.
// Block-sparse masks and dropout (notes/02_online_softmax.md, "Dropout and block-sparse masks"):
// a hidden key is skipped like a causally masked one (the tiled form skips a whole tile whose
// mask block is 0: nothing of it is loaded or computed); a dropped key still counts in l (the
// softmax is of the undropped scores, and LSE with it) but adds nothing to O, and O is
// divided by l (1 - p) once at the end. Z_ij is regenerated from (seed, b, h, i, j) wherever it
// is needed (common/dropout.hpp), so no rung ever stores it.
// What it adds over 01: one pass over keys; O(d) state per row instead of a row of S.
// What the next step (03) does: the same math moved to the GPU, naively.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dropout.hpp"
#include "error.hpp"
#include "exercise.hpp"
#include "step.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace ladder {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The per-key recurrences below sum l one key at a time; every kSumBlock keys that block's sum
// is folded into the blocks before (l_done, rescaled from the max they were summed under, by
// exactly 1 when it held), as a tiled kernel sums l. One running fp32 sum over N keys loses
// about N unit roundoffs, blocks about 32 + N / 32: what the harness's yardstick allows.
constexpr int64_t kSumBlock = 32;
struct BlockedSum {
  float m_done = kNegInf, l_done = 0;
  // Moves l (summed under max m) into the blocks before; l starts the next block at 0.
  void fold(float m, float& l) {
    l_done = (m_done == kNegInf ? 0.f : l_done * std::exp(m_done - m)) + l;
    m_done = m, l = 0;
  }
};

float dot(const float* a, const float* b, int64_t d) {
  float s = 0;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// Writes row `row` of O (divided by l, and by 1 - p under dropout) and its LSE; l == 0 means
// no visible key.
void finish_row(Outputs& out, int64_t row, int64_t d, const float* o, float m, float l,
                float keep_scale) {
  const float inv_l = l > 0 ? keep_scale / l : 0.f;
  for (int64_t c = 0; c < d; ++c) out.o.data[size_t(row * d + c)] = o[c] * inv_l;
  out.lse.data[size_t(row)] =
      l > 0 ? double(m + std::log(l)) : -std::numeric_limits<double>::infinity();
}

struct Views {  // the float32 copies of the inputs, and per-head pointers into them
  const Problem& p;
  const std::vector<float>&Q, &K, &V;
  const BlockMask& mask;
  // Dropout: 1 / (1 - p) (1 without dropout), and Z of key j for row i of head (b, h).
  float keep_scale() const { return p.dropout > 0 ? float(1.0 / (1.0 - p.dropout)) : 1.f; }
  bool kept(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return p.dropout == 0 ||
           dropout::keep(p.dropout_seed, dropout::threshold(p.dropout), b, h, i, j);
  }
  const float* q(int64_t b, int64_t h, int64_t i) const {
    return &Q[size_t(((b * p.heads + h) * p.seq_q + i) * p.dim)];
  }
  const float* k(int64_t b, int64_t h, int64_t j) const {
    return &K[size_t(((b * p.heads_kv + h / p.group()) * p.seq_k + j) * p.dim)];
  }
  const float* v(int64_t b, int64_t h, int64_t j) const {
    return &V[size_t(((b * p.heads_kv + h / p.group()) * p.seq_k + j) * p.dim)];
  }
};

// Two passes: (m, l) online in the first, then O with the final m and l.
void two_pass(const Views& x, Outputs& out) {
  const Problem& p = x.p;
  const float scale = float(p.softmax_scale());
  std::vector<float> o(static_cast<size_t>(p.dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const int64_t n = p.visible_keys(i);
        float m = kNegInf, l = 0;
        BlockedSum sum;
        for (int64_t j = 0; j < n; ++j) {  // pass 1: running max and rescaled sum
          if (j % kSumBlock == 0) sum.fold(m, l);
          if (!x.mask.visible(b, h, i, j)) continue;
          const float s = scale * dot(x.q(b, h, i), x.k(b, h, j), p.dim);
          // EXERCISE BEGIN online-max-sum [medium]
          // Concept: the online softmax normaliser: one pass for the max and the sum, the sum
          // corrected whenever the max grows.
          //
          // Before this key, m is the largest logit so far and l = sum of exp(logit - m) over
          // them (over this block's keys: the loop folds l into the blocks before every
          // kSumBlock keys). Fold in the logit s so that both statements hold again. What happens
          // to the terms already in l when m changes? The first key arrives with m = -inf, l = 0.
          const float m_new = std::max(m, s);
          l = l * std::exp(m - m_new) + std::exp(s - m_new);
          m = m_new;
          // EXERCISE END
        }
        sum.fold(m, l);
        l = sum.l_done;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t j = 0; j < n; ++j) {  // pass 2: P_ij = exp(S_ij - m) (divided by l at the end)
          if (!x.mask.visible(b, h, i, j) || !x.kept(b, h, i, j)) continue;
          const float pij = std::exp(scale * dot(x.q(b, h, i), x.k(b, h, j), p.dim) - m);
          const float* vj = x.v(b, h, j);
          for (int64_t c = 0; c < p.dim; ++c) o[size_t(c)] += pij * vj[c];
        }
        finish_row(out, (b * p.heads + h) * p.seq_q + i, p.dim, o.data(), m, l, x.keep_scale());
      }
}

// One pass: the attention recurrence with running m, l and unnormalised O.
void one_pass(const Views& x, Outputs& out) {
  const Problem& p = x.p;
  const float scale = float(p.softmax_scale());
  std::vector<float> o(static_cast<size_t>(p.dim)), zero(static_cast<size_t>(p.dim), 0.f);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const int64_t n = p.visible_keys(i);
        float m = kNegInf, l = 0;
        BlockedSum sum;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t j = 0; j < n; ++j) {
          if (j % kSumBlock == 0) sum.fold(m, l);
          if (!x.mask.visible(b, h, i, j)) continue;
          const float s = scale * dot(x.q(b, h, i), x.k(b, h, j), p.dim);
          // A dropped key (Z = 0) still counts in l; its V row adds nothing to O.
          const float* vj = x.kept(b, h, i, j) ? x.v(b, h, j) : zero.data();
          // EXERCISE BEGIN online-update [hard]
          // Concept: the online-softmax rescale: a running max, sum and unnormalised output
          // that stay exact as the max grows, in one pass over the keys.
          //
          // Invariant, over the keys folded so far: m is their largest logit, l = sum of
          // exp(logit - m) (over this block's keys: the loop folds l into the blocks before
          // every kSumBlock keys), o[0..d) = sum of exp(logit - m) * V. Fold in key j (logit s,
          // value row vj) so that the invariant holds for one more key. The first key arrives with
          // m = -inf, l = 0, o = 0 and must not make a NaN. No division here: finish_row divides
          // once, at the end.
          const float m_new = std::max(m, s);
          const float alpha = std::exp(m - m_new);  // rescales what was summed under the old max
          const float pij = std::exp(s - m_new);
          l = alpha * l + pij;
          for (int64_t c = 0; c < p.dim; ++c) o[size_t(c)] = alpha * o[size_t(c)] + pij * vj[c];
          m = m_new;
          // EXERCISE END
        }
        sum.fold(m, l);
        finish_row(out, (b * p.heads + h) * p.seq_q + i, p.dim, o.data(), m, sum.l_done,
                   x.keep_scale());
      }
}

// Tiled: FlashAttention-2's loop order on the CPU. For each query tile Q_i (Br rows) keep
// m_i, l_i and O_i; for each key tile K_j, V_j (Bc rows) form the Br x Bc tile of scores
// S_ij = scale Q_i K_j^T and fold the whole tile into each row's state at once.
void tiled(const Views& x, Outputs& out, int64_t Br, int64_t Bc) {
  const Problem& p = x.p;
  const int64_t M = p.seq_q, N = p.seq_k, d = p.dim;
  const float scale = float(p.softmax_scale());
  const int64_t Tr = (M + Br - 1) / Br, Tc = (N + Bc - 1) / Bc;
  std::vector<float> S(static_cast<size_t>(Br * Bc)), O(static_cast<size_t>(Br * d));
  std::vector<float> m(static_cast<size_t>(Br)), l(static_cast<size_t>(Br));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t ti = 0; ti < Tr; ++ti) {
        const int64_t i0 = ti * Br, rows = std::min(Br, M - i0);
        std::fill(O.begin(), O.end(), 0.f);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.f);
        // Causal: tiles starting past the last key visible to this tile's last row are skipped.
        const int64_t n_vis = p.visible_keys(i0 + rows - 1);
        const int64_t tc_end = std::min(Tc, (n_vis + Bc - 1) / Bc);
        for (int64_t tj = 0; tj < tc_end; ++tj) {
          const int64_t j0 = tj * Bc, cols = std::min(Bc, N - j0);
          // EXERCISE BEGIN block-skip [easy]
          // Concept: a block-sparse mask is honoured by skipping: a key tile in a mask block of
          // 0 is never computed, which is both the mask and the saving.
          //
          // x.mask.visible(b, h, i, j) says whether the mask block holding (i, j) is kept. Br
          // and Bc divide the mask block, so one tile lies in one block. Nothing below looks
          // at the mask: computing a hidden tile would count its keys in l and O.
          if (!x.mask.visible(b, h, i0, j0)) continue;
          // EXERCISE END
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = p.visible_keys(i0 + r);  // mask inside the tile
            float row_max = kNegInf;
            for (int64_t c = 0; c < cols; ++c) {
              const float s =
                  j0 + c < n ? scale * dot(x.q(b, h, i0 + r), x.k(b, h, j0 + c), d) : kNegInf;
              S[size_t(r * Bc + c)] = s;
              row_max = std::max(row_max, s);
            }
            // EXERCISE BEGIN tile-update [hard]
            // Concept: FlashAttention-2's tile update: one rescale per row per tile, a row that
            // has seen no visible key yet, and dropout that thins O but not the normaliser.
            //
            // Row r's state is m[r], l[r] and the unnormalised O row at &O[r * d], for the
            // tiles before this one. S[r * Bc + c] (c < cols) holds this tile's scores, -inf
            // where masked, and row_max their max. Fold the whole tile in at once (the one-key
            // update of `one_pass`, a tile at a time). A row with no visible score in this
            // tile or before must keep l = 0 and O = 0: what would -inf - -inf give? A dropped
            // key (!x.kept(b, h, i0 + r, j0 + c)) counts in l but adds nothing to O.
            const float m_new = std::max(m[size_t(r)], row_max);
            if (m_new == kNegInf) continue;  // nothing visible yet: exp(-inf - -inf) would be NaN
            const float alpha = std::exp(m[size_t(r)] - m_new);
            float row_sum = 0;
            float* o = &O[size_t(r * d)];
            for (int64_t c = 0; c < d; ++c) o[c] *= alpha;
            for (int64_t c = 0; c < cols; ++c) {
              const float pij = std::exp(S[size_t(r * Bc + c)] - m_new);
              row_sum += pij;
              if (!x.kept(b, h, i0 + r, j0 + c)) continue;  // dropped: in l, not in O
              const float* vj = x.v(b, h, j0 + c);
              for (int64_t e = 0; e < d; ++e) o[e] += pij * vj[e];
            }
            l[size_t(r)] = alpha * l[size_t(r)] + row_sum;
            m[size_t(r)] = m_new;
            // EXERCISE END
          }
        }
        for (int64_t r = 0; r < rows; ++r)
          finish_row(out, (b * p.heads + h) * M + i0 + r, d, &O[size_t(r * d)], m[size_t(r)],
                     l[size_t(r)], x.keep_scale());
      }
}

// The descriptor's tiles(): the tiled variant's Br x Bc, 64 or the sequence when shorter unless
// --tile-q/--tile-k ask for others; the other variants are not tiled.
Tiles choose_tiles(const Problem& p, const RunOptions& o, const DeviceInfo&) {
  if (o.variant != "tiled") {
    if (o.tile_q != 0 || o.tile_k != 0)
      throw BadInput("--tile-q and --tile-k apply to step 02's tiled variant only");
    return Tiles{};
  }
  auto pick = [](int asked, int64_t seq, const char* flag, const char* len) {
    if (asked == 0) return int(std::min<int64_t>(64, seq));
    if (asked > seq)
      throw BadInput(std::string(flag) + " must be in [1, " + len + " = " + std::to_string(seq) +
                     "], got " + std::to_string(asked));
    return asked;
  };
  return Tiles{pick(o.tile_q, p.seq_q, "--tile-q", "seq_q"),
               pick(o.tile_k, p.seq_k, "--tile-k", "seq_k")};
}

double workspace_bytes(const Problem& p, const RunOptions& o) {
  const double tiles =
      o.variant == "tiled" ? double(o.tile_q) * o.tile_k + o.tile_q * double(p.dim) : 0.0;
  return 4.0 * (tiles + double(p.dim) * 2 + double(p.q_numel() + 2 * p.kv_numel()));
}

RunResult run(const Problem& p, const Inputs& in, Outputs& out, const RunOptions& opt) {
  const std::vector<float> Q = to_float(in.q), K = to_float(in.k), V = to_float(in.v);
  const Views x{p, Q, K, V, in.mask};
  RunResult r;
  if (opt.variant == "two-pass") {
    r.fwd_ms = time_cpu_ms([&] { two_pass(x, out); }, opt.repeats, opt.warmup);
    r.workspace_bytes = double(p.dim) * 4;
  } else if (opt.variant == "tiled") {
    const int64_t Br = opt.tile_q, Bc = opt.tile_k;  // the descriptor's choice (choose_tiles)
    r.fwd_ms = time_cpu_ms([&] { tiled(x, out, Br, Bc); }, opt.repeats, opt.warmup);
    r.workspace_bytes = double(Br * Bc + Br * p.dim + 2 * Br) * 4;
    r.config = "Br=" + std::to_string(Br) + " Bc=" + std::to_string(Bc);
  } else {
    r.fwd_ms = time_cpu_ms([&] { one_pass(x, out); }, opt.repeats, opt.warmup);
    r.workspace_bytes = double(p.dim) * 4;
  }
  return r;
}

}  // namespace

const Step& step_02() {
  static const Step s =
      StepBuilder(
          2, "02_online_softmax", Device::cpu,
          "online softmax: 2-pass (m, l fused), then the one-pass recurrence (running m, l, "
          "O; one divide)")
          .adds({"online (m, l), the sum corrected as the max grows",
                 "one-pass recurrence with unnormalised O", "one division at the end",
                 "tiled Br x Bc form (FlashAttention pseudocode)",
                 "block-sparse masks, skipped a tile at a time",
                 "dropout regenerated from a counter-based generator, never stored"})
          .dtypes({DType::f32})
          .dropout()
          .block_sparse()
          .limits(
              "tiled variant: Br, Bc from --tile-q/--tile-k in [1, seq_q] and [1, seq_k] (default "
              "64, or the sequence when shorter); with a block mask they must divide its block")
          .variants(
              {{"one-pass", "the attention recurrence: running m, l and unnormalised O", true},
               {"two-pass", "online (m, l) in pass 1, O in pass 2", true},
               {"tiled", "the one-pass recurrence over Br x Bc tiles of S", true}})
          .tiles(choose_tiles)
          .workspace(workspace_bytes)
          .run(run);
  return s;
}

}  // namespace ladder

// kv_router.hpp: the routing decision of a KV-cache-aware router.
//
// Given how many leading blocks of a request each worker already holds
// (KvIndex::find_matches) and each worker's load, pick the worker that
// minimizes NVIDIA Dynamo's default cost
//
//     cost(w) = overlap_weight * prefill_blocks(w) + decode_blocks(w)
//     prefill_blocks(w) = (prefill_tokens(w) + request_tokens - cached_tokens(w)) / block_size
//     cached_tokens(w) = min(request_tokens, matched_blocks(w) * block_size)
//
// where prefill_tokens(w) is the uncached tokens of the requests on w whose
// prefill has not finished, each counted whole until it finishes, and
// decode_blocks(w) the KV blocks the requests in flight hold (see
// docs/kv_router.md for what Dynamo counts in each). The first term is the
// prefill work queued on w if the request goes there, the second the decode
// work w carries: a large overlap_weight chases cache hits, 0 balances load
// alone.
//
// With temperature 0 the cheapest worker wins; ties go to the worker holding
// fewer blocks in total (the one whose cache loses least from the extra
// blocks), then to the smallest (worker_id, dp_rank), so a decision is a pure
// function of its inputs. With temperature T > 0 a worker is drawn with
// probability proportional to exp(-x / T), x = (cost - min) / (max - min):
// costs are rescaled to [0, 1] first, so T means the same whatever the
// magnitudes (all costs equal: uniform). Dividing the rescaled cost, never the
// range times T, keeps every weight a number: a T so small that x / T
// overflows gives the costlier workers weight 0, the limit of the softmax as T
// goes to 0. A cost that overflowed to infinity (a huge weight times a huge
// prefill) gets weight 0 and is left out of min and max; when every cost is
// infinite they count as equal. The draw takes a uniform number in [0, 1)
// from the caller, so tests and simulations control the randomness.
#pragma once

#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
#endif
#if !defined(PROMPTCACHE_KV_ROUTER_HPP) && \
    (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
#define PROMPTCACHE_KV_ROUTER_HPP

#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

namespace promptcache {

/// Cost parameters of KvRouter (Dynamo's `--kv-overlap-score-weight`,
/// `--router-temperature` and the engine's KV block size).
struct KvRouterConfig {
  double overlap_weight = 1.0;  ///< Weight of the prefill term; >= 0 and finite.
  /// 0: cheapest worker; > 0: softmax sampling (so small a T that the costlier
  /// weights underflow draws among the cheapest only). Finite.
  double temperature = 0.0;
  std::size_t block_size = 16;  ///< Tokens per KV block (as hashed for the index); > 0.
};

/// One routable worker rank and its current load.
struct KvWorkerLoad {
  KvWorker worker;  ///< The worker rank.
  /// KV blocks of the requests in flight on it; for Dynamo's cost, plus the
  /// request's full blocks not among them (see docs/kv_router.md).
  std::size_t decode_blocks = 0;
  std::size_t cached_blocks = 0;  ///< Blocks it holds in total (tie-break; 0 if unknown).
  /// Uncached tokens of the requests whose prefill on it has not finished, each
  /// counted whole until it finishes (Dynamo's active prefill tokens; 0: idle).
  std::size_t prefill_tokens = 0;
};

/// The cost terms of one candidate, as used by a decision.
struct KvRouteCandidate {
  KvWorker worker;                 ///< The worker rank.
  std::size_t matched_blocks = 0;  ///< Leading blocks of the request it holds.
  std::size_t cached_tokens = 0;   ///< min(request tokens, matched_blocks * block_size).
  /// (in-flight prefill tokens + request tokens - cached_tokens) / block_size.
  double prefill_blocks = 0.0;
  double decode_blocks = 0.0;  ///< KvWorkerLoad::decode_blocks.
  double cost = 0.0;  ///< overlap_weight * prefill_blocks + decode_blocks; may be +infinity.
};

/// A routing decision: the chosen candidate and where it stood in the input.
struct KvRouteDecision {
  KvRouteCandidate chosen;  ///< The chosen worker and its cost terms.
  std::size_t index = 0;    ///< Its position in the `workers` span given to select().
};

/// Dynamo-compatible worker selection (see the file comment). Stateless apart
/// from its configuration: a value type, cheap to copy, safe to share between
/// threads for concurrent const calls.
class KvRouter {
 public:
  /// A router with Dynamo's defaults (overlap weight 1, temperature 0) and 16-token blocks.
  KvRouter() = default;

  /// A router with `config`. Throws std::invalid_argument when overlap_weight
  /// is negative or not finite, temperature is negative or not finite, or
  /// block_size is 0. O(1).
  explicit KvRouter(const KvRouterConfig& config) : config_(config) {
    if (!std::isfinite(config.overlap_weight) || config.overlap_weight < 0.0)
      throw std::invalid_argument("KvRouter: overlap_weight must be finite and >= 0");
    if (!std::isfinite(config.temperature) || config.temperature < 0.0)
      throw std::invalid_argument("KvRouter: temperature must be finite and >= 0");
    if (config.block_size == 0) throw std::invalid_argument("KvRouter: block_size must be > 0");
  }

  /// The configuration. O(1).
  [[nodiscard]] const KvRouterConfig& config() const noexcept { return config_; }

  /// The cost terms of routing a request of `request_tokens` tokens to a
  /// worker holding `matched_blocks` of its leading blocks, carrying
  /// `decode_blocks` in flight and `prefill_tokens` still to prefill. A match
  /// longer than the request counts as the whole request; no input overflows
  /// an integer, but a huge overlap_weight can make the cost +infinity. O(1).
  [[nodiscard]] KvRouteCandidate candidate(const KvWorker& worker, std::size_t request_tokens,
                                           std::size_t matched_blocks, std::size_t decode_blocks,
                                           std::size_t prefill_tokens = 0) const noexcept {
    KvRouteCandidate c;
    c.worker = worker;
    c.matched_blocks = matched_blocks;
    const std::size_t bs = config_.block_size;
    // Up to request_tokens / bs blocks the product is at most request_tokens, so
    // it cannot overflow; one block more already covers the whole request.
    c.cached_tokens = matched_blocks > request_tokens / bs ? request_tokens : matched_blocks * bs;
    // In double: the sum of two token counts may exceed SIZE_MAX.
    c.prefill_blocks = (static_cast<double>(prefill_tokens) +
                        static_cast<double>(request_tokens - c.cached_tokens)) /
                       static_cast<double>(bs);
    c.decode_blocks = static_cast<double>(decode_blocks);
    c.cost = config_.overlap_weight * c.prefill_blocks + c.decode_blocks;
    return c;
  }

  /// The cost terms of every worker in `workers`, in that order, with its match
  /// looked up in `matches` (a worker absent from `matches` holds 0 blocks; a
  /// match for a worker absent from `workers` is ignored, as that worker cannot
  /// take requests; for a worker listed twice in `matches` the first entry
  /// counts). O(|workers| * |matches|) for short lists, O((|workers| +
  /// |matches|) log |matches|) beyond 16 matches.
  [[nodiscard]] std::vector<KvRouteCandidate> candidates(
      std::size_t request_tokens, std::span<const KvWorkerMatch> matches,
      std::span<const KvWorkerLoad> workers) const {
    std::vector<KvRouteCandidate> out;
    out.reserve(workers.size());
    std::vector<KvWorkerMatch> sorted;
    const bool use_sorted = matches.size() > 16;
    if (use_sorted) {
      sorted.assign(matches.begin(), matches.end());
      std::stable_sort(sorted.begin(), sorted.end(), worker_less);
    }
    for (const KvWorkerLoad& w : workers) {
      std::size_t matched = 0;
      if (use_sorted) {
        auto it = std::lower_bound(
            sorted.begin(), sorted.end(), w.worker,
            [](const KvWorkerMatch& m, const KvWorker& k) { return less(m.worker, k); });
        if (it != sorted.end() && it->worker == w.worker) matched = it->blocks;
      } else {
        for (const KvWorkerMatch& m : matches)
          if (m.worker == w.worker) {
            matched = m.blocks;
            break;
          }
      }
      out.push_back(
          candidate(w.worker, request_tokens, matched, w.decode_blocks, w.prefill_tokens));
    }
    return out;
  }

  /// Picks the worker for a request of `request_tokens` tokens among
  /// `workers`. Temperature 0: the cheapest (ties: fewer cached_blocks, then
  /// the smallest worker id and rank), `sample` is unused. Temperature > 0:
  /// probabilities() walked in (worker_id, dp_rank) order with the uniform
  /// number `sample` (clamped into [0, 1); NaN counts as 0), so a worker of
  /// probability 0 is never drawn. Returns nullopt when `workers` is empty.
  /// O(candidates() + |workers| log |workers|).
  [[nodiscard]] std::optional<KvRouteDecision> select(std::size_t request_tokens,
                                                      std::span<const KvWorkerMatch> matches,
                                                      std::span<const KvWorkerLoad> workers,
                                                      double sample = 0.0) const {
    if (workers.empty()) return std::nullopt;
    const std::vector<KvRouteCandidate> cands = candidates(request_tokens, matches, workers);
    if (config_.temperature == 0.0) {
      std::size_t best = 0;
      for (std::size_t i = 1; i < cands.size(); ++i) {
        const KvRouteCandidate& a = cands[i];
        const KvRouteCandidate& b = cands[best];
        if (a.cost != b.cost) {
          if (a.cost < b.cost) best = i;
          continue;
        }
        if (workers[i].cached_blocks != workers[best].cached_blocks) {
          if (workers[i].cached_blocks < workers[best].cached_blocks) best = i;
          continue;
        }
        if (less(a.worker, b.worker)) best = i;
      }
      return KvRouteDecision{cands[best], best};
    }
    // Softmax: a fixed walk order makes the draw a function of `sample` alone.
    std::vector<std::size_t> order(cands.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      return less(cands[x].worker, cands[y].worker);
    });
    const std::vector<double> p = probabilities(cands);
    double u = sample;
    if (!(u >= 0.0)) u = 0.0;  // also catches NaN
    if (u >= 1.0) u = std::nextafter(1.0, 0.0);
    double cum = 0.0;
    for (std::size_t i : order) {
      cum += p[i];
      if (u < cum) return KvRouteDecision{cands[i], i};
    }
    // Rounding left the sum just below u: the last worker with p > 0 takes it
    // (there is one: the cheapest worker's p is at least 1 / |workers|).
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (p[*it] > 0.0) return KvRouteDecision{cands[*it], *it};
    return KvRouteDecision{cands[order.back()], order.back()};
  }

  /// As select() above, drawing the uniform number from `rng`, a
  /// UniformRandomBitGenerator over all 64-bit values (e.g. std::mt19937_64),
  /// which is called once only when the temperature is > 0.
  template <class Rng>
  [[nodiscard]] std::optional<KvRouteDecision> select(std::size_t request_tokens,
                                                      std::span<const KvWorkerMatch> matches,
                                                      std::span<const KvWorkerLoad> workers,
                                                      Rng& rng) const {
    static_assert(Rng::min() == 0 && Rng::max() == std::numeric_limits<std::uint64_t>::max(),
                  "KvRouter::select needs a generator of full-range 64-bit values");
    double u = 0.0;
    if (config_.temperature > 0.0 && !workers.empty())
      u = static_cast<double>(static_cast<std::uint64_t>(rng()) >> 11) * 0x1.0p-53;
    return select(request_tokens, matches, workers, u);
  }

  /// The softmax probabilities select() draws from at this temperature, one
  /// per candidate in the given order (temperature 0: 1 for each cheapest
  /// candidate divided by their count). For candidates made by candidates()
  /// always finite and summing to 1 (up to rounding): an infinite cost gets 0
  /// unless every cost is infinite, which counts as all costs equal. O(|cands|).
  [[nodiscard]] std::vector<double> probabilities(std::span<const KvRouteCandidate> cands) const {
    std::vector<double> p(cands.size(), 0.0);
    if (cands.empty()) return p;
    // min and max over the finite costs (costs are never NaN: all terms are >= 0).
    double lo = std::numeric_limits<double>::infinity();
    double hi = -std::numeric_limits<double>::infinity();
    for (const KvRouteCandidate& c : cands) {
      if (!std::isfinite(c.cost)) continue;
      lo = std::min(lo, c.cost);
      hi = std::max(hi, c.cost);
    }
    if (config_.temperature == 0.0 || !(lo < hi)) {
      // Mass on the cheapest set; all costs infinite: lo is infinite and all are in it.
      std::size_t n = 0;
      for (const KvRouteCandidate& c : cands)
        n += c.cost == lo ? 1U : 0U;
      for (std::size_t i = 0; i < cands.size(); ++i)
        p[i] = cands[i].cost == lo ? 1.0 / static_cast<double>(n) : 0.0;
      return p;
    }
    // hi - lo is finite (both are finite and >= 0) and > 0, so x is in [0, 1];
    // x / T is in [0, +inf] for any T > 0, and exp of its negation in [0, 1].
    const double range = hi - lo;
    double sum = 0.0;
    for (std::size_t i = 0; i < cands.size(); ++i) {
      const double c = cands[i].cost;
      p[i] = std::isfinite(c) ? std::exp(-((c - lo) / range) / config_.temperature) : 0.0;
      sum += p[i];  // the cheapest adds exp(0) = 1, so sum >= 1
    }
    for (double& x : p)
      x /= sum;
    return p;
  }

 private:
  static bool less(const KvWorker& a, const KvWorker& b) noexcept {
    return a.worker_id != b.worker_id ? a.worker_id < b.worker_id : a.dp_rank < b.dp_rank;
  }
  static bool worker_less(const KvWorkerMatch& a, const KvWorkerMatch& b) noexcept {
    return less(a.worker, b.worker);
  }

  KvRouterConfig config_{};
};

}  // namespace promptcache

#endif  // PROMPTCACHE_KV_ROUTER_HPP

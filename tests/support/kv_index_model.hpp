// A naive reference model of KvIndex: per worker rank, the set of root-to-block paths it
// holds and the name of each, with the event rules written the obvious way. The
// randomized differential test and the fuzz harness drive the index and this model with
// the same events and compare every result.
#pragma once

#include <promptcache/kv_index.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

namespace kv_index_model {

using promptcache::KvBlock;
using promptcache::KvEvent;
using promptcache::KvEventStatus;
using promptcache::KvGapPolicy;
using promptcache::KvWorker;
using promptcache::KvWorkerMatch;
namespace kv_event = promptcache::kv_event;

using Path = std::vector<std::uint64_t>;

struct ModelWorker {
  std::map<std::uint64_t, Path> names;  // block hash -> path
  std::map<Path, std::uint64_t> paths;  // path -> block hash
  std::optional<std::uint64_t> last;    // cursor
};

struct Outcome {
  KvEventStatus status = KvEventStatus::applied;
  std::size_t stored = 0, already = 0, removed = 0, cascaded = 0, not_held = 0;
  bool reset = false;
};

// The documented event rules, written the obvious way.
class Model {
 public:
  explicit Model(KvGapPolicy policy) : policy_(policy) {}

  Outcome apply(const KvWorker& w, const KvEvent& e) {
    ModelWorker& mw = workers_[w];
    Outcome o;
    if (mw.last) {
      if (e.event_id <= *mw.last) {
        o.status = KvEventStatus::stale;
        return o;
      }
      if (e.event_id != *mw.last + 1) {
        if (policy_ == KvGapPolicy::report) {
          o.status = KvEventStatus::gap;
          return o;
        }
        o.cascaded += mw.names.size();
        mw.names.clear();
        mw.paths.clear();
        o.reset = true;
      }
    }
    content(mw, e.data, o);
    mw.last = e.event_id;
    return o;
  }

  // Applies a payload without cursor checks (dump replay).
  static void content(ModelWorker& mw, const promptcache::KvEventData& data, Outcome& o) {
    if (const auto* s = std::get_if<kv_event::Stored>(&data)) {
      Path path;
      if (s->parent_hash) {
        const auto it = mw.names.find(*s->parent_hash);
        if (it == mw.names.end()) {
          o.status = KvEventStatus::parent_not_found;
          return;
        }
        path = it->second;
      }
      ModelWorker next = mw;
      for (const KvBlock& b : s->blocks) {
        path.push_back(b.tokens_hash);
        const auto named = next.names.find(b.block_hash);
        if (named != next.names.end()) {
          if (named->second != path) {
            o.status = KvEventStatus::block_conflict;
            o.stored = o.already = 0;
            return;
          }
          ++o.already;
          continue;
        }
        if (next.paths.count(path) != 0U) {
          o.status = KvEventStatus::block_conflict;
          o.stored = o.already = 0;
          return;
        }
        next.names[b.block_hash] = path;
        next.paths[path] = b.block_hash;
        ++o.stored;
      }
      mw = std::move(next);
    } else if (const auto* r = std::get_if<kv_event::Removed>(&data)) {
      for (const std::uint64_t name : r->block_hashes) {
        const auto it = mw.names.find(name);
        if (it == mw.names.end()) {
          ++o.not_held;
          continue;
        }
        ++o.removed;
        const Path prefix = it->second;
        for (auto p = mw.paths.begin(); p != mw.paths.end();) {
          if (p->first.size() >= prefix.size() &&
              std::equal(prefix.begin(), prefix.end(), p->first.begin())) {
            if (p->first.size() > prefix.size()) ++o.cascaded;
            mw.names.erase(p->second);
            p = mw.paths.erase(p);
          } else {
            ++p;
          }
        }
      }
    } else {
      o.cascaded += mw.names.size();
      mw.names.clear();
      mw.paths.clear();
    }
  }

  std::vector<KvWorkerMatch> find(const Path& q, bool early_exit) const {
    std::vector<KvWorkerMatch> out;
    out.reserve(workers_.size());
    Path p;  // the prefix looked up; its capacity serves every worker
    p.reserve(q.size());
    for (const auto& [w, mw] : workers_) {
      std::size_t k = 0;
      p.clear();
      while (k < q.size()) {
        p.push_back(q[k]);
        if (mw.paths.count(p) == 0U) break;
        ++k;
      }
      if (k > 0) out.push_back(KvWorkerMatch{w, k});
    }
    if (early_exit) {
      // The walk stops at the first depth that only one worker reaches.
      std::size_t deepest = 0;
      for (const auto& m : out)
        deepest = std::max(deepest, m.blocks);
      for (std::size_t d = 1; d <= deepest; ++d) {
        std::size_t reach = 0;
        for (const auto& m : out)
          reach += m.blocks >= d ? 1U : 0U;
        if (reach == 1) {
          for (auto& m : out)
            m.blocks = std::min(m.blocks, d);
          break;
        }
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<KvEvent> dump(const KvWorker& w) const {
    // One Stored per path, parents first (map order sorts a prefix first).
    std::vector<KvEvent> out;
    const auto it = workers_.find(w);
    if (it == workers_.end()) return out;
    const ModelWorker& mw = it->second;
    for (const auto& [path, name] : mw.paths) {
      kv_event::Stored s;
      if (path.size() > 1) s.parent_hash = mw.paths.at(Path(path.begin(), path.end() - 1));
      s.blocks.push_back(KvBlock{name, path.back()});
      out.push_back(KvEvent{out.size(), std::move(s)});
    }
    return out;
  }

  void replace(const KvWorker& w, std::uint64_t last) {
    ModelWorker& mw = workers_[w];
    mw.last = last;
  }
  void erase(const KvWorker& w) { workers_.erase(w); }
  [[nodiscard]] bool contains(const KvWorker& w) const { return workers_.count(w) != 0U; }
  [[nodiscard]] const ModelWorker* get(const KvWorker& w) const {
    const auto it = workers_.find(w);
    return it == workers_.end() ? nullptr : &it->second;
  }
  std::map<KvWorker, ModelWorker>& all() { return workers_; }

 private:
  KvGapPolicy policy_;
  std::map<KvWorker, ModelWorker> workers_;
};

}  // namespace kv_index_model

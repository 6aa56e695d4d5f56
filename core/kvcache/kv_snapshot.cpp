#include "core/kvcache/kv_snapshot.h"

namespace tokenfab {

KvSnapshot KvSnapshot::capture(const BlockPool& pool, const PrefixCache& cache,
                               int32_t n_sequences) {
  KvSnapshot s;
  s.block_size = pool.block_size();
  s.n_blocks = pool.n_blocks();
  s.n_free = pool.n_free();
  s.n_owned = pool.n_owned();
  s.n_cached = pool.n_cached();
  s.n_sequences = n_sequences;
  s.prefix = cache.stats();
  s.blocks = pool.records();
  pool.slot_view(s.block_slots, s.slot_refs);
  return s;
}

}  // namespace tokenfab

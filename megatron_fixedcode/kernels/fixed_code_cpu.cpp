// The fixed code's forward on CPU in one pass: token ids -> tiled activations.
//
// For each token (in parallel): its K-bit code word is looked up (XOR of per-id-byte tables for
// the table-free code, one row of a V-entry table for the lookup code), its K activation values
// are picked from values2 = {value of bit 0, value of bit 1}, and the K values are written into
// every tile of the token's output row. Only selection and copies: the output is bit-identical to
// FixedCodeEmbedding's torch path. One kernel instead of ~9 small ops, each of which pays a cold
// cache/TLB start after the previous step's large writes.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <type_traits>

namespace {

template <typename word_t>
inline uint64_t as_bits(word_t w) {  // narrow signed words hold two's complement codes
  return static_cast<uint64_t>(static_cast<std::make_unsigned_t<word_t>>(w));
}

template <typename out_t, int64_t KC>
inline void write_tiles(out_t* row, const out_t* values, int64_t hidden) {
  // KC: the code width as a compile-time constant (vectorizable inner copy).
  int64_t h = 0;
  for (; h + KC <= hidden; h += KC)
    for (int64_t k = 0; k < KC; ++k) row[h + k] = values[k];
  for (int64_t k = 0; h + k < hidden; ++k) row[h + k] = values[k];
}

template <typename out_t>
inline void write_tiles_any(out_t* row, const out_t* values, int64_t num_bits, int64_t hidden) {
  // First tile, then double the written prefix until the row is full.
  const int64_t first = num_bits < hidden ? num_bits : hidden;
  std::memcpy(row, values, first * sizeof(out_t));
  for (int64_t filled = first; filled < hidden;) {
    const int64_t count = filled < hidden - filled ? filled : hidden - filled;
    std::memcpy(row + filled, row, count * sizeof(out_t));
    filled += count;
  }
}

template <typename out_t, typename word_t>
bool lift_codes(const int64_t* ids, int64_t batch, int64_t seq, int64_t s_begin, int64_t s_count,
                int64_t vocab_size, const word_t* tables, int64_t num_tables, bool lookup,
                const out_t* values2, int64_t num_bits, int64_t hidden, out_t* out) {
  std::atomic<bool> all_valid{true};
  at::parallel_for(0, s_count * batch, 64, [&](int64_t begin, int64_t end) {
    out_t values[64];
    constexpr int64_t kAhead = 16;  // the lookup's V-entry table is read at random: prefetch it
    for (int64_t n = begin; n < end; ++n) {  // n = s * batch + b: the output's [s, b] order
      const int64_t id = ids[(n % batch) * seq + s_begin + n / batch];
      if (lookup && n + kAhead < end) {
        const int64_t ahead = ids[((n + kAhead) % batch) * seq + s_begin + (n + kAhead) / batch];
        if (ahead >= 0 && ahead < vocab_size) __builtin_prefetch(tables + ahead);
      }
      if (id < 0 || id >= vocab_size) {  // the caller raises; this row is left unwritten
        all_valid.store(false, std::memory_order_relaxed);
        continue;
      }
      uint64_t code;
      if (lookup) {
        code = as_bits(tables[id]);
      } else {
        code = as_bits(tables[id & 255]);
        for (int64_t j = 1; j < num_tables; ++j) code ^= as_bits(tables[j * 256 + ((id >> (8 * j)) & 255)]);
      }
      for (int64_t k = 0; k < num_bits; ++k) values[k] = values2[(code >> k) & 1];
      out_t* row = out + n * hidden;
      if (num_bits == 16) write_tiles<out_t, 16>(row, values, hidden);
      else if (num_bits == 17) write_tiles<out_t, 17>(row, values, hidden);
      else write_tiles_any(row, values, num_bits, hidden);
    }
  });
  return all_valid.load();
}

}  // namespace

// ids_BS: int64 [B, S] contiguous; positions [s_begin, s_begin + s_count) are written to
// out_SBH [s_count, B, H]. tables: the lookup's V code words, or the table-free code's
// [ceil(K/8), 256] words per id byte (the offset folded into byte 0's). Returns false if an id
// is outside [0, vocab_size).
bool fixed_code_lift(torch::Tensor ids_BS, int64_t s_begin, int64_t s_count, int64_t vocab_size,
                     torch::Tensor tables, bool lookup, torch::Tensor values2, int64_t num_bits,
                     torch::Tensor out_SBH) {
  TORCH_CHECK(ids_BS.scalar_type() == at::kLong && ids_BS.is_contiguous() && ids_BS.dim() == 2, "ids: int64 [B, S]");
  TORCH_CHECK(tables.is_contiguous() && values2.is_contiguous() && out_SBH.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(num_bits >= 1 && num_bits <= 62, "num_bits in [1, 62]");
  TORCH_CHECK(out_SBH.size(0) == s_count && out_SBH.size(1) == ids_BS.size(0), "out: [s_count, B, H]");
  const int64_t batch = ids_BS.size(0), seq = ids_BS.size(1), hidden = out_SBH.size(2);
  const int64_t num_tables = lookup ? 1 : tables.size(0);
  TORCH_CHECK(lookup ? tables.numel() >= vocab_size : tables.numel() == num_tables * 256, "tables");
  bool all_valid = true;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_SBH.scalar_type(), "fixed_code_lift", [&] {
    using out_t = scalar_t;
    AT_DISPATCH_INTEGRAL_TYPES(tables.scalar_type(), "fixed_code_lift_words", [&] {
      all_valid = lift_codes<out_t, scalar_t>(ids_BS.data_ptr<int64_t>(), batch, seq, s_begin, s_count,
                                              vocab_size, tables.data_ptr<scalar_t>(), num_tables, lookup,
                                              values2.data_ptr<out_t>(), num_bits, hidden,
                                              out_SBH.data_ptr<out_t>());
    });
  });
  return all_valid;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fixed_code_lift", &fixed_code_lift, "ids -> tiled fixed-code activations, one pass (CPU)");
}

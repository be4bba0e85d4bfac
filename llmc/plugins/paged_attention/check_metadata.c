/* What the CPU attention kernel refuses before it writes anything, and how it says so: metadata
 * (query_start_loc, seq_lens, block_tables, slot_mapping) that would read or write outside the
 * paged cache, each failure a PA_BAD_* code with its sentence (llmc_pa_status_message). */
#include "attention_parts.h"

const char *llmc_pa_status_message(int status) {
  switch (status) {
    case PA_BAD_QUERY_START_LOC:
      return "query_start_loc must start at 0, end at num_tokens and never decrease";
    case PA_BAD_SEQ_LEN:
      return "every seq_lens[b] must be at least its sequence's new-token count and fit its "
             "block table";
    case PA_BAD_BLOCK_ID:
      return "block_tables holds a block id outside [0, num_blocks) within a sequence's context";
    case PA_BAD_SLOT:
      return "slot_mapping holds a slot outside [0, num_blocks * block_size)";
    case PA_BAD_CACHE_DTYPE:
      return "the cache dtype code is not one the kernel knows";
    default:
      return "unknown status";
  }
}

int llmc_pa_check_metadata(const int32_t *seq_lens, const int32_t *query_start_loc,
                           const int32_t *block_tables, int64_t block_table_stride,
                           int max_blocks, const int64_t *slot_mapping, int num_tokens,
                           int num_seqs, int64_t num_blocks, int block_size) {
  if (query_start_loc[0] != 0 || query_start_loc[num_seqs] != num_tokens) {
    return PA_BAD_QUERY_START_LOC;
  }
  for (int b = 0; b < num_seqs; ++b) {
    int num_new = query_start_loc[b + 1] - query_start_loc[b];
    if (num_new < 0) return PA_BAD_QUERY_START_LOC;
    if (num_new == 0) continue; /* a sequence without new tokens is never read */
    if (seq_lens[b] < num_new || seq_lens[b] > (int64_t)max_blocks * block_size) {
      return PA_BAD_SEQ_LEN;
    }
    const int32_t *row = block_tables + b * block_table_stride;
    for (int i = 0; i < (seq_lens[b] + block_size - 1) / block_size; ++i) {
      if (row[i] < 0 || row[i] >= num_blocks) return PA_BAD_BLOCK_ID;
    }
  }
  for (int t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] < 0 || slot_mapping[t] >= num_blocks * block_size) return PA_BAD_SLOT;
  }
  return PA_OK;
}

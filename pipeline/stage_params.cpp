#include <encore/pipeline/stage_params.h>

#include "common/cuda_check.h"

namespace encore::pipeline {

Status validate(const EmbedParams& p) {
  ENCORE_REQUIRE(p.vocab >= 1 && p.batch >= 1 && p.hidden >= 4 && p.hidden % 4 == 0, StatusCode::kInvalidArgument,
                 "embed: vocab and batch must be >= 1 and hidden a positive multiple of 4 (got ", p.vocab, ", ", p.batch,
                 ", ", p.hidden, ")");
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("embed", p.table, 16, "table"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("embed", p.token_ids, 4, "token_ids"));
  ENCORE_RETURN_IF_ERROR(detail::check_pointer("embed", p.x, 16, "x"));
  const std::size_t x_bytes = std::size_t(p.batch) * p.hidden * 4;
  ENCORE_RETURN_IF_ERROR(detail::check_disjoint("embed", {p.table, std::size_t(p.vocab) * p.hidden * 2, "table"}, {p.x, x_bytes, "x"}));
  return detail::check_disjoint("embed", {p.token_ids, std::size_t(p.batch) * 4, "token_ids"}, {p.x, x_bytes, "x"});
}

}  // namespace encore::pipeline

// The part paths, one per kind (worker/part_path.h); PartPaths builds one of each.
#pragma once
#include <memory>

#include "worker/part_path.h"

namespace fastps {

std::unique_ptr<PartPath> make_plain_path(const PathContext& ctx);
// The plain sum under the rack hierarchy: parts of another rack's server go to this rack's relay.
std::unique_ptr<PartPath> make_relayed_path(const PathContext& ctx);
std::unique_ptr<PartPath> make_routed_path(const PathContext& ctx);
std::unique_ptr<PartPath> make_fetch_path(const PathContext& ctx);
std::unique_ptr<PartPath> make_compressed_path(const PathContext& ctx);

}  // namespace fastps

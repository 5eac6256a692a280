// The Vercel connector: backfills the deployments of one Vercel project per work unit through
// GET /v6/deployments, as webhook-shaped "deployment.*" events (SPEC C2, API-FACTS Part B).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "backhaul/connector.hpp"

namespace backhaul::vercel {

// Settings of one connector instance: the create() config, described by
// schemas/connectors/vercel.schema.json (and by the descriptor's config_schema_json).
struct VercelConfig {
  std::string base_url = "https://api.vercel.com";  // never ends with '/'
  std::optional<std::string> team_id;               // sent as teamId; absent: personal account
  int limit = 100;                                  // deployments per page, 1..100
  uint32_t timeout_ms = 30'000;                     // whole-request timeout asked of the host

  // Parses and checks a config document. Empty text means "all defaults". Throws
  // sdk::Error(BACKHAUL_INVALID_ARGUMENT) naming the offending field (or the unknown key).
  static VercelConfig parse(std::string_view config_json);
};

// One instance serves many work units; it holds only its immutable config, so validate_scopes and
// fetch_page may run concurrently on the same instance. [thread-safe]
class VercelConnector final : public sdk::Connector {
 public:
  // Throws sdk::Error(BACKHAUL_INVALID_ARGUMENT), like the constructor, for a bad config.
  static void validate_config(std::string_view config_json);
  explicit VercelConnector(std::string_view config_json);

  // GET /v9/projects/{projectId}: OK when the token can read the project; FATAL when the project
  // does not exist or the token lacks access to it; AUTH_EXPIRED for an invalid token.
  void validate_scopes(const sdk::Unit& unit) override;

  // One page of GET /v6/deployments, newest first. The cursor is opaque to the host; see
  // vercel_connector.cpp for its format. Throws sdk::Error with the status the failure maps to.
  sdk::Page fetch_page(const sdk::FetchRequest& request) override;

 private:
  const VercelConfig config_;
};

}  // namespace backhaul::vercel

// The exported entry of the vercel plugin: its descriptor and the BACKHAUL_DEFINE_CONNECTOR entry.
#include "backhaul/connector.hpp"

#include "vercel_connector.h"

namespace {

const char* const kEntityTypes[] = {"deployment"};

// Kept equal to schemas/connectors/vercel.schema.json (a test compares them).
constexpr const char* kConfigSchema = R"json(
{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "Vercel connector configuration",
  "description": "The create() config of the vercel connector. Every key is optional.",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "base_url": {
      "description": "Vercel REST API base URL; a trailing slash is ignored.",
      "type": "string",
      "pattern": "^https?://[^/?#\\s]+(/[^?#\\s]*)?$",
      "default": "https://api.vercel.com"
    },
    "team_id": {
      "description": "Team id (team_...) sent as teamId for team-owned projects; omit for a personal account.",
      "type": "string",
      "minLength": 1
    },
    "limit": {
      "description": "Deployments per page (Vercel's maximum is 100).",
      "type": "integer",
      "minimum": 1,
      "maximum": 100,
      "default": 100
    },
    "timeout_ms": {
      "description": "Whole-request timeout in milliseconds.",
      "type": "integer",
      "minimum": 1,
      "maximum": 600000,
      "default": 30000
    }
  }
}
)json";

// Constant-initialized: the host reads it before any plugin code has run.
const backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t),
    "vercel",
    "1.0.0",
    "Vercel",
    "Backfills the deployments of Vercel projects as deployment.* webhook events.",
    kEntityTypes,
    sizeof(kEntityTypes) / sizeof(kEntityTypes[0]),
    kEntityTypes,
    sizeof(kEntityTypes) / sizeof(kEntityTypes[0]),
    kConfigSchema,
};

}  // namespace

BACKHAUL_DEFINE_CONNECTOR(backhaul::vercel::VercelConnector, kDescriptor);

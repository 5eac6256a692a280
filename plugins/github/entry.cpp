// The plugin's one exported symbol, backhaul_entry, and the static facts it carries. Everything
// here is constant-initialized: no plugin code runs before the host has checked the entry.
#include "backhaul/connector.hpp"

#include "config.h"
#include "github_connector.h"

namespace backhaul::github {
namespace {

const char* const kEntityTypes[] = {"pull_request", "issue", "release"};

const backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t),
    "github",
    "1.0.0",
    "GitHub",
    "Pull requests, issues and releases of GitHub repositories (REST API, Link pagination).",
    kEntityTypes,
    sizeof(kEntityTypes) / sizeof(kEntityTypes[0]),
    kEntityTypes,  // all of them by default
    sizeof(kEntityTypes) / sizeof(kEntityTypes[0]),
    kConfigSchemaJson,
};

}  // namespace
}  // namespace backhaul::github

BACKHAUL_DEFINE_CONNECTOR(backhaul::github::GithubConnector, backhaul::github::kDescriptor);

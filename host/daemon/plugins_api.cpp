// /v1/plugins: what is loaded, and a config check before a connector is created (as Kafka
// Connect's PUT /connector-plugins/{plugin}/config/validate).
#include <map>
#include <string>

#include "core/plugins/plugin.h"
#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Response;
using nlohmann::json;

// The worker processes of each isolated connector, by plugin id (none without isolation).
std::map<std::string, plugins::WorkerStats> workers_of(const Call& call) {
  return call.deps.plugin_workers ? call.deps.plugin_workers()
                                  : std::map<std::string, plugins::WorkerStats>();
}

json workers_json(const plugins::WorkerStats& stats) {
  json lost = json::object();
  for (size_t r = 0; r < plugins::kWorkerLossCount; ++r) {
    lost[plugins::loss_name(static_cast<plugins::WorkerLoss>(r))] = stats.lost[r];
  }
  return {{"busy", stats.busy}, {"idle", stats.idle}, {"lost", std::move(lost)}};
}

json plugin_json(const plugins::Plugin& plugin,
                 const std::map<std::string, plugins::WorkerStats>& workers) {
  const plugins::PluginInfo& info = plugin.info();
  json schema = json::parse(info.config_schema_json, nullptr, false);
  json j = {{"id", info.id},
            {"version", info.version},
            {"displayName", info.display_name},
            {"description", info.description},
            {"entityTypes", info.entity_types},
            {"defaultEntityTypes", info.default_entity_types},
            {"abi",
             std::to_string(info.abi_version.major) + "." + std::to_string(info.abi_version.minor)},
            {"path", info.path.string()},
            {"isolated", plugin.isolated()},
            {"configSchema", schema.is_discarded() ? json(nullptr) : schema}};
  if (auto it = workers.find(info.id); it != workers.end()) j["workers"] = workers_json(it->second);
  return j;
}

Response validate_config(Call& call, const std::string& id) {
  const std::optional<plugins::Plugin> plugin = call.deps.plugins.find(id);
  if (!plugin) throw not_found("PLUGIN_NOT_FOUND", "plugin " + id + " is not loaded");
  const json body = call.json_body();
  require_known_fields(body, {"config"});  // a misspelt field is not a config said valid
  if (!body.contains("config")) throw validation_error("config", "is required");
  if (!body["config"].is_object()) throw validation_error("config", "must be a JSON object");
  json errors = json::array();
  try {
    plugin->validate_config(body["config"].dump());
  } catch (const plugins::PluginCrashed& e) {
    // Its worker died or hung (isolation): no verdict on the config, which may well be valid.
    throw ApiError(503, "UNAVAILABLE",
                   "plugin " + id + " could not check the config: " + std::string(e.what()),
                   json::object(), true);
  } catch (const plugins::ConnectorFailure& e) {
    errors.push_back(e.what());
  }
  call.summary = "validate config of plugin " + id + ": " + (errors.empty() ? "valid" : "invalid");
  return call.ok(200, {{"plugin", id}, {"valid", errors.empty()}, {"errors", errors}});
}

}  // namespace

Response handle_plugins(Call& call, Route rest) {
  if (rest.empty()) {
    allow_only(call, {"GET"});
    json items = json::array();
    const std::map<std::string, plugins::WorkerStats> workers = workers_of(call);
    for (const plugins::Plugin& plugin : call.deps.plugins.plugins()) {
      items.push_back(plugin_json(plugin, workers));
    }
    return call.ok(200, {{"items", std::move(items)}});
  }
  const std::string id(rest[0]);
  if (rest.size() == 1) {
    allow_only(call, {"GET"});
    const std::optional<plugins::Plugin> plugin = call.deps.plugins.find(id);
    if (!plugin) throw not_found("PLUGIN_NOT_FOUND", "plugin " + id + " is not loaded");
    return call.ok(200, plugin_json(*plugin, workers_of(call)));
  }
  if (rest.size() == 2 && rest[1] == "validate-config") {
    allow_only(call, {"POST"});
    return validate_config(call, id);
  }
  throw not_found("NOT_FOUND", "no route for " + call.request.path);
}

}  // namespace backhaul::daemon

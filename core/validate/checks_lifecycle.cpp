// Configs, instances and argument handling: create/validate_config with good and bad configs,
// create/destroy cycles, requests the plugin must refuse without asking the provider.
#include "core/validate/checks.h"

namespace backhaul::validate {
namespace {

using nlohmann::json;

// Not configs by any schema whose root is an object.
const char* const kInvalidConfigs[] = {"{not json", "[1, 2, 3]"};
// Never produced by a plugin as a next_cursor.
const char* const kCorruptCursors[] = {"\x01\x02 not a cursor \x7f", ""};
constexpr const char* kUnknownEntityType = "backhaul-validate-no-such-type";
constexpr int kCreateCycles = 200;
constexpr int kWarmupCycles = 5;
// Growth of the heap per create/destroy or fetch/release cycle that counts as a leak. Allocators
// keep a little (thread caches, size-class bins), but never a steady amount per cycle.
constexpr int64_t kLeakBytesPerCycle = 32;
constexpr int64_t kLeakMinTotalBytes = 8 * 1024;

json call_json(const CallResult& r) {
  return {{"status", r.status}, {"text", r.describe()}, {"message", r.message}};
}

bool has_message(const json& call) { return !call.at("message").get<std::string>().empty(); }
backhaul_status_t status_of(const json& call) { return call.at("status").get<backhaul_status_t>(); }

// --- valid and invalid configs ------------------------------------------------------------------

Verdict config_accepted(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    CallResult validated = driver.validate_config(t.config_json);
    CallResult created;
    std::optional<InstanceHandle> instance = driver.create(t.config_json, created);
    return json{{"validate", call_json(validated)}, {"create", call_json(created)}};
  });
  const std::string hint = " (give a config with --config or in validate.json)";
  if (status_of(r["validate"]) != BACKHAUL_OK)
    return fail("validate_config rejected " + quote_text(t.config_json) + ": " +
                r["validate"]["text"].get<std::string>() + hint);
  if (status_of(r["create"]) != BACKHAUL_OK)
    return fail("create rejected " + quote_text(t.config_json) +
                " although validate_config accepted it: " + r["create"]["text"].get<std::string>() +
                hint);
  return pass("config " + quote_text(t.config_json));
}

const json& invalid_config_results(CheckContext& ctx) {
  return ctx.shared("invalid_configs", [&] {
    return ctx.with_fault(Fault::kHttp500, [](const PluginDriver& driver, FaultTransport&) {
      json out = json::array();
      for (const char* config : kInvalidConfigs) {
        CallResult created;
        std::optional<InstanceHandle> instance = driver.create(config, created);
        out.push_back({{"config", config},
                       {"validate", call_json(driver.validate_config(config))},
                       {"create", call_json(created)}});
      }
      return out;
    });
  });
}

// Each invalid config must make `call` fail with a message (and, when `exact`, with
// INVALID_ARGUMENT).
Verdict judge_invalid_configs(CheckContext& ctx, const char* call, bool exact) {
  for (const json& r : invalid_config_results(ctx)) {
    const json& result = r.at(call);
    const std::string config = quote_text(r.at("config").get<std::string>());
    const backhaul_status_t status = status_of(result);
    if (status == BACKHAUL_OK)
      return fail(std::string(call) + " accepted the invalid config " + config);
    if (!has_message(result))
      return fail(std::string(call) + " rejected " + config + " with " + status_text(status) +
                  " but no message");
    if (exact && status != BACKHAUL_INVALID_ARGUMENT)
      return fail(std::string(call) + " rejected " + config + " with " +
                  result["text"].get<std::string>() + "; expected INVALID_ARGUMENT");
  }
  return pass(std::string(call) + " rejects malformed JSON and non-object configs");
}

Verdict invalid_config_rejected(CheckContext& ctx) {
  return judge_invalid_configs(ctx, "create", false);
}
Verdict validate_config_rejects_invalid(CheckContext& ctx) {
  return judge_invalid_configs(ctx, "validate", false);
}
Verdict invalid_config_status(CheckContext& ctx) {
  Verdict v = judge_invalid_configs(ctx, "validate", true);
  if (v.status != CheckStatus::kPass) return v;
  v = judge_invalid_configs(ctx, "create", true);
  if (v.status == CheckStatus::kPass) v.reason = "INVALID_ARGUMENT from validate_config and create";
  return v;
}

// --- instances
// ------------------------------------------------------------------------------------

Verdict create_destroy_cycles(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    for (int i = 0; i < kWarmupCycles; ++i) driver.create_or_throw(t.config_json);
    const int64_t before = heap_in_use();
    for (int i = 0; i < kCreateCycles; ++i) driver.create_or_throw(t.config_json);
    return json{{"growth", heap_in_use() - before}};
  });
  const int64_t growth = r["growth"].get<int64_t>();
  if (growth >= kLeakMinTotalBytes && growth >= kLeakBytesPerCycle * kCreateCycles)
    return fail("the heap grew by " + std::to_string(growth) + " bytes over " +
                std::to_string(kCreateCycles) + " create/destroy cycles (" +
                std::to_string(growth / kCreateCycles) + " per cycle): destroy() leaks");
  return pass(std::to_string(kCreateCycles) + " cycles, heap change " + std::to_string(growth) +
              " bytes");
}

// --- requests to refuse -------------------------------------------------------------------------

// A status that says "this request is wrong", as opposed to "try again".
bool is_refusal(backhaul_status_t status) {
  return status == BACKHAUL_INVALID_ARGUMENT || status == BACKHAUL_FATAL;
}

Verdict judge_refusal(const json& r, const std::string& what) {
  const backhaul_status_t status = status_of(r);
  if (status == BACKHAUL_OK) return fail("fetch_page returned a page for " + what);
  if (!has_message(r)) return fail("fetch_page refused " + what + " without a message");
  if (!is_refusal(status))
    return fail("fetch_page answered " + what + " with " + r["text"].get<std::string>() +
                "; expected INVALID_ARGUMENT or FATAL (retrying cannot help)");
  return pass(r["text"].get<std::string>());
}

Verdict unknown_entity_type_rejected(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    FetchOutcome out = driver.fetch(instance.get(), t.first_page(kUnknownEntityType));
    return call_json(out.result);
  });
  return judge_refusal(r, std::string("the unknown entity type \"") + kUnknownEntityType + "\"");
}

Verdict corrupt_cursor_rejected(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    json out = json::array();
    for (const char* cursor : kCorruptCursors) {
      FetchSpec spec = t.first_page(t.entity_types.front());
      spec.cursor = cursor;
      json result = call_json(driver.fetch(instance.get(), spec).result);
      result["cursor"] = cursor;
      out.push_back(result);
    }
    return out;
  });
  for (const json& result : r) {
    Verdict v = judge_refusal(
        result, "the corrupt cursor " + quote_text(result["cursor"].get<std::string>()));
    if (v.status != CheckStatus::kPass) return v;
  }
  return pass("corrupt and empty cursors are refused");
}

Verdict release_page_null(CheckContext& ctx) {
  const Target& t = ctx.target();
  ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    try {
      driver.entry().release_page(instance.get(), nullptr);
    } catch (...) {
      throw AbiViolation("release_page(NULL) let a C++ exception cross the ABI");
    }
    return json::object();
  });
  return pass("release_page(instance, NULL) is ignored");
}

}  // namespace

std::vector<Check> lifecycle_checks() {
  return {
      {"config_accepted", "lifecycle", 1, Needs::kLoadedPlugin,
       "validate_config and create accept the config under test", config_accepted},
      {"invalid_config_rejected", "lifecycle", 1, Needs::kLoadedPlugin,
       "create refuses malformed and non-object configs with a message, without crashing",
       invalid_config_rejected},
      {"validate_config_rejects_invalid", "lifecycle", 2, Needs::kLoadedPlugin,
       "validate_config refuses the same configs with a message", validate_config_rejects_invalid},
      {"unknown_entity_type_rejected", "lifecycle", 3, Needs::kLoadedPlugin,
       "fetch_page refuses an unknown entity type with INVALID_ARGUMENT or FATAL",
       unknown_entity_type_rejected},
      {"create_destroy_cycles", "lifecycle", 4, Needs::kLoadedPlugin,
       "200 create/destroy cycles neither crash nor grow the heap", create_destroy_cycles},
      {"invalid_config_status", "lifecycle", 5, Needs::kLoadedPlugin,
       "a bad config is INVALID_ARGUMENT from both validate_config and create",
       invalid_config_status},
      {"release_page_null", "lifecycle", 5, Needs::kLoadedPlugin,
       "release_page(instance, NULL) is ignored, as the ABI says", release_page_null},
      {"corrupt_cursor_rejected", "lifecycle", 6, Needs::kLoadedPlugin,
       "fetch_page refuses a corrupt or empty cursor with INVALID_ARGUMENT or FATAL",
       corrupt_cursor_rejected},
  };
}

}  // namespace backhaul::validate

// G1: what the file and its backhaul_entry declare. The ELF checks read the file only; the entry
// is read in a child (dlopen runs the library's constructors) and judged here.
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>

#include "core/common/json_check.h"
#include "core/plugins/plugin_loader.h"
#include "core/validate/checks.h"
#include "core/validate/json_schema_lint.h"
#include <cxxabi.h>

namespace backhaul::validate {
namespace {

using nlohmann::json;

std::string version_text(int major, int minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string hex(uint64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "0x%llX", static_cast<unsigned long long>(value));
  return buffer;
}

std::string join(const std::vector<std::string>& items, const char* separator = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : separator) + s;
  return out;
}

// --- file ---------------------------------------------------------------------------------------

Verdict elf_shared_object(CheckContext& ctx) {
  const ElfFacts& elf = ctx.elf();
  if (!elf.problem.empty()) return fail(ctx.options().plugin_path.string() + " " + elf.problem);
  return pass("64-bit ELF shared object for this machine");
}

Verdict entry_symbol_by_dlsym(CheckContext& ctx) {
  const json& facts = ctx.entry_facts();
  if (facts.contains("dlopen_error")) return skip("the library does not load (see library_loads)");
  if (!facts.value("found", false)) return fail(BACKHAUL_ENTRY_SYMBOL " is not exported (dlsym)");
  return pass("found by dlsym (the file's dynamic symbol table is not readable)");
}

Verdict entry_symbol_exported(CheckContext& ctx) {
  const ElfFacts& elf = ctx.elf();
  if (!elf.problem.empty()) return skip("not a loadable ELF shared object (see elf_shared_object)");
  if (!elf.has_dynsym) return entry_symbol_by_dlsym(ctx);
  if (!elf.entry || !elf.entry->defined) {
    std::string exported = elf.exported_sample.empty() ? "it exports no symbols at all"
                                                       : "it exports " + join(elf.exported_sample);
    return fail(BACKHAUL_ENTRY_SYMBOL " is not exported (" + exported +
                "); define it with BACKHAUL_DEFINE_CONNECTOR and build with "
                "backhaul_add_connector()");
  }
  if (!elf.entry->global || !elf.entry->visible)
    return fail(BACKHAUL_ENTRY_SYMBOL
                " is defined but hidden (local binding or hidden "
                "visibility); declare it BACKHAUL_EXPORT");
  if (!elf.entry->is_object)
    return fail(BACKHAUL_ENTRY_SYMBOL
                " is a function; it must be the const backhaul_entry_t object");
  return pass("exported, " + std::to_string(elf.entry->size) + " bytes");
}

// A C++ symbol's name as a reader knows it ("typeinfo for std::_Mutex_base<...>"), else as is.
std::string demangled(const std::string& name) {
  int status = -1;
  std::unique_ptr<char, void (*)(void*)> text(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && text ? std::string(text.get()) : name;
}

// Every other name a plugin exports can bind to the host's own definition of it (the C++ library's
// template instantiations, a JSON or fmt library the plugin links in too), or the host's to the
// plugin's: two versions of one function, which fails far from its cause. SDK plugins export the
// entry alone (backhaul_add_connector's version script).
Verdict exports_only_entry(CheckContext& ctx) {
  const ElfFacts& elf = ctx.elf();
  if (!elf.problem.empty()) return skip("not a loadable ELF shared object (see elf_shared_object)");
  if (!elf.has_dynsym)
    return skip("the dynamic symbol table is not readable (no dynamic segment or section)");
  if (elf.exported_others == 0) return pass(BACKHAUL_ENTRY_SYMBOL " is the only symbol exported");
  const size_t n = elf.exported_others;
  std::vector<std::string> names;
  for (const std::string& name : elf.exported_sample) names.push_back(demangled(name));
  return fail("exports " + std::to_string(n) + (n == 1 ? " symbol" : " symbols") +
              " besides " BACKHAUL_ENTRY_SYMBOL " (" + join(names, "; ") +
              (n > elf.exported_sample.size() ? ", ..." : "") +
              "), which can bind to the host's own definitions of those names; build with "
              "backhaul_add_connector(), or link with a version script that makes everything "
              "but " BACKHAUL_ENTRY_SYMBOL " local");
}

Verdict library_loads(CheckContext& ctx) {
  if (!ctx.elf().problem.empty()) return skip("not a loadable ELF shared object");
  const json& facts = ctx.entry_facts();
  if (facts.contains("dlopen_error"))
    return fail("dlopen failed: " + facts["dlopen_error"].get<std::string>());
  return pass("dlopen(RTLD_NOW | RTLD_LOCAL) resolved every symbol");
}

// --- entry --------------------------------------------------------------------------------------

// The entry facts, or nullptr with `verdict` set to a skip naming the check that failed first.
const json* entry_facts_or_skip(CheckContext& ctx, Verdict& verdict) {
  if (!ctx.elf().problem.empty()) {
    verdict = skip("not a loadable ELF shared object (see elf_shared_object)");
    return nullptr;
  }
  const json& facts = ctx.entry_facts();
  if (facts.contains("dlopen_error")) {
    verdict = skip("the library does not load (see library_loads)");
    return nullptr;
  }
  if (!facts.value("found", false)) {
    verdict = skip("no " BACKHAUL_ENTRY_SYMBOL " to inspect (see entry_symbol_exported)");
    return nullptr;
  }
  return &facts;
}

std::string layout_mismatch(const json& m) {
  std::vector<std::string> diffs;
  auto compare = [&](const char* what, const char* key, size_t ours) {
    const size_t theirs = m.value(key, size_t{0});
    if (theirs != ours)
      diffs.push_back(std::string(what) + " " + std::to_string(theirs) + " (host " +
                      std::to_string(ours) + ")");
  };
  compare("pointer", "pointer_size", sizeof(void*));
  compare("backhaul_string_t", "string_size", sizeof(backhaul_string_t));
  compare("backhaul_error_t", "error_size", sizeof(backhaul_error_t));
  compare("backhaul_event_t", "event_size", sizeof(backhaul_event_t));
  return join(diffs);
}

Verdict entry_layout(CheckContext& ctx) {
  Verdict verdict;
  const json* facts = entry_facts_or_skip(ctx, verdict);
  if (!facts) return verdict;
  const uint32_t size = facts->value("struct_size", 0u);
  constexpr size_t kPrefix = offsetof(backhaul_entry_t, descriptor);
  if (size < kPrefix)
    return fail("backhaul_entry.struct_size is " + std::to_string(size) +
                " bytes, too small for the version and magic block (" + std::to_string(kPrefix) +
                ")");
  const json& magic = facts->at("magic");
  const uint64_t value = magic.value("magic", uint64_t{0});
  if (value != BACKHAUL_ABI_MAGIC)
    return fail("magic is " + hex(value) + ", expected " + hex(BACKHAUL_ABI_MAGIC) +
                " (initialize it with BACKHAUL_MAGIC_INIT)");
  if (std::string diff = layout_mismatch(magic); !diff.empty())
    return fail("struct sizes differ from this host: " + diff);
  const auto& symbol = ctx.elf().entry;
  if (symbol && symbol->size > 0 && symbol->size < size)
    return fail("struct_size says " + std::to_string(size) + " bytes but the " +
                BACKHAUL_ENTRY_SYMBOL + " object is only " + std::to_string(symbol->size));
  return pass("struct_size " + std::to_string(size) + ", magic and struct sizes match the host");
}

Verdict abi_version(CheckContext& ctx) {
  Verdict verdict;
  const json* facts = entry_facts_or_skip(ctx, verdict);
  if (!facts) return verdict;
  if (!facts->contains("abi")) return fail("backhaul_entry is too small to hold abi_version");
  const int major = facts->at("abi").value("major", 0);
  const int minor = facts->at("abi").value("minor", 0);
  const std::string theirs = version_text(major, minor);
  const std::string ours = version_text(BACKHAUL_ABI_VERSION_MAJOR, BACKHAUL_ABI_VERSION_MINOR);
  if (major != BACKHAUL_ABI_VERSION_MAJOR)
    return fail("plugin ABI " + theirs + " is incompatible with host ABI " + ours +
                " (major versions differ)");
  if (minor > BACKHAUL_ABI_VERSION_MINOR)
    return fail("plugin ABI " + theirs + " is newer than host ABI " + ours);
  const size_t needed = minor == 0 ? BACKHAUL_ENTRY_SIZE_V1_0 : sizeof(backhaul_entry_t);
  const uint32_t size = facts->value("struct_size", 0u);
  if (size < needed)
    return fail("backhaul_entry is " + std::to_string(size) + " bytes; ABI " + theirs + " needs " +
                std::to_string(needed));
  return pass("plugin ABI " + theirs + ", host ABI " + ours);
}

Verdict function_table(CheckContext& ctx) {
  Verdict verdict;
  const json* facts = entry_facts_or_skip(ctx, verdict);
  if (!facts) return verdict;
  const json& functions = facts->value("functions", json::object());
  std::vector<std::string> missing;
  for (const char* name : {"init", "deinit", "validate_config", "create", "destroy",
                           "validate_scopes", "fetch_page", "release_page"}) {
    if (!functions.value(name, false)) missing.emplace_back(name);
  }
  if (!missing.empty()) return fail("NULL or missing: " + join(missing));
  return pass(functions.value("get_extension", false) ? "all functions set, get_extension too"
                                                      : "all required functions set");
}

// --- descriptor ---------------------------------------------------------------------------------

Verdict descriptor_layout(CheckContext& ctx) {
  Verdict verdict;
  const json* facts = entry_facts_or_skip(ctx, verdict);
  if (!facts) return verdict;
  if (!facts->contains("descriptor"))
    return skip(
        "the entry is too small, its magic is wrong or its ABI major is another (see "
        "entry_layout, abi_version): its descriptor is not read");
  const json& d = facts->at("descriptor");
  if (d.is_null()) return fail("backhaul_entry.descriptor is NULL");
  const uint32_t size = d.value("struct_size", 0u);
  if (size < sizeof(backhaul_descriptor_t))
    return fail("descriptor struct_size is " + std::to_string(size) + ", expected at least " +
                std::to_string(sizeof(backhaul_descriptor_t)));
  std::vector<std::string> null_fields;
  for (const char* field : {"id", "version", "display_name", "config_schema_json"}) {
    if (d.value(field, json()).is_null()) null_fields.emplace_back(field);
  }
  if (!null_fields.empty()) return fail("descriptor fields are NULL: " + join(null_fields));
  return pass("struct_size " + std::to_string(size));
}

// The descriptor facts, or nullptr with `verdict` set when descriptor_layout did not pass.
const json* descriptor_or_skip(CheckContext& ctx, Verdict& verdict) {
  const json* facts = entry_facts_or_skip(ctx, verdict);
  if (!facts) return nullptr;
  if (descriptor_layout(ctx).status != CheckStatus::kPass) {
    verdict = skip("the descriptor is unreadable (see descriptor_layout)");
    return nullptr;
  }
  return &facts->at("descriptor");
}

Verdict plugin_id(CheckContext& ctx) {
  Verdict verdict;
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return verdict;
  const std::string id = d->at("id").get<std::string>();
  if (!plugins::is_valid_plugin_id(id))
    return fail("id " + quote_text(id) + " does not match [a-z][a-z0-9_-]*");
  return pass("id " + quote_text(id));
}

Verdict plugin_version(CheckContext& ctx) {
  Verdict verdict;
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return verdict;
  const std::string version = d->at("version").get<std::string>();
  if (!plugins::is_semver(version))
    return fail("version " + quote_text(version) +
                " is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD], SemVer 2.0.0)");
  return pass("version " + quote_text(version));
}

// Problems of a list of names: NULL list, NULL or empty entries, duplicates.
std::vector<std::string> list_problems(const json& list, size_t count, const char* what) {
  if (count > 1000)
    return {std::string(what) + " count " + std::to_string(count) + " is implausible"};
  if (list.is_null())
    return {std::string(what) + " list is NULL but its count is " + std::to_string(count)};
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const json& item : list) {
    if (item.is_null() || item.get<std::string>().empty()) {
      problems.push_back(std::string(what) + " has a NULL or empty entry");
    } else if (!seen.insert(item.get<std::string>()).second) {
      problems.push_back(std::string(what) + " lists " + quote_text(item.get<std::string>()) +
                         " twice");
    }
  }
  return problems;
}

std::vector<std::string> names(const json& list) {
  std::vector<std::string> out;
  if (!list.is_array()) return out;
  for (const json& item : list) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

Verdict entity_types(CheckContext& ctx) {
  Verdict verdict;
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return verdict;
  const size_t count = d->value("entity_type_count", size_t{0});
  if (count == 0) return fail("the descriptor lists no entity types");
  auto problems = list_problems(d->at("entity_types"), count, "entity types");
  if (!problems.empty()) return fail(join(problems, "; "));
  return pass(join(names(d->at("entity_types"))));
}

Verdict default_entity_types(CheckContext& ctx) {
  Verdict verdict;
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return verdict;
  const size_t count = d->value("default_entity_type_count", size_t{0});
  if (count == 0) return pass("none (a run must name its entity types)");
  auto problems = list_problems(d->at("default_entity_types"), count, "default entity types");
  if (!problems.empty()) return fail(join(problems, "; "));
  const std::vector<std::string> supported = names(d->at("entity_types"));
  const std::set<std::string> known(supported.begin(), supported.end());
  for (const std::string& t : names(d->at("default_entity_types"))) {
    if (!known.count(t))
      return fail("default entity type " + quote_text(t) + " is not among the supported ones (" +
                  join(supported) + ")");
  }
  return pass(join(names(d->at("default_entity_types"))));
}

// The config schema parsed, or nullopt with `verdict` set.
std::optional<json> config_schema(CheckContext& ctx, Verdict& verdict) {
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return std::nullopt;
  const std::string text = d->at("config_schema_json").get<std::string>();
  if (const size_t depth = json_depth(text); depth > plugins::kMaxConfigSchemaDepth) {
    verdict = fail("config_schema_json nests " + std::to_string(depth) + " deep; at most " +
                   std::to_string(plugins::kMaxConfigSchemaDepth) +
                   " (the host refuses it: deeper, a copy or a dump of it overflows the stack)");
    return std::nullopt;
  }
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    verdict = fail(std::string("config_schema_json is not valid JSON: ") + e.what());
    return std::nullopt;
  }
}

Verdict config_schema_json(CheckContext& ctx) {
  Verdict verdict;
  std::optional<json> schema = config_schema(ctx, verdict);
  if (!schema) return verdict;
  if (!schema->is_object())
    return fail(std::string("config_schema_json is a JSON ") + schema->type_name() +
                ", not a JSON Schema object");
  return pass("a JSON object");
}

Verdict config_schema_keywords(CheckContext& ctx) {
  Verdict verdict;
  std::optional<json> schema = config_schema(ctx, verdict);
  if (!schema) return verdict;
  if (!schema->is_object()) return skip("not a JSON object (see config_schema_json)");
  SchemaLint lint = lint_json_schema(*schema, /*root_is_config=*/true);
  std::vector<std::string>& problems = lint.problems;
  if (problems.empty()) {
    std::string note = "keywords well-formed, root type object";
    if (!lint.notes.empty()) note += "; " + lint.notes.front();
    return pass(note);
  }
  if (problems.size() > 3) problems.resize(3);
  return fail(join(problems, "; "));
}

Verdict display_metadata(CheckContext& ctx) {
  Verdict verdict;
  const json* d = descriptor_or_skip(ctx, verdict);
  if (!d) return verdict;
  auto text = [&](const char* key) {
    const json& v = d->value(key, json());
    return v.is_string() ? v.get<std::string>() : std::string();
  };
  if (text("display_name").empty()) return fail("display_name is empty");
  if (text("description").empty()) return fail("description is NULL or empty");
  return pass(quote_text(text("display_name")));
}

// --- the host loader ----------------------------------------------------------------------------

json info_to_json(const plugins::PluginInfo& info) {
  return {{"id", info.id},
          {"version", info.version},
          {"abi", version_text(info.abi_version.major, info.abi_version.minor)},
          {"entity_types", info.entity_types},
          {"default_entity_types", info.default_entity_types}};
}

Verdict loader_accepts(CheckContext& ctx) {
  json result = ctx.in_child([&]() -> json {
    FakeClock clock(kValidationEpochMs);
    FaultTransport offline(Fault::kConnectionError, clock);
    try {
      note_activity("while the host's loader loads the plugin (constructors or init())");
      std::optional<plugins::Plugin> plugin =
          plugins::load_plugin(ctx.options().plugin_path, plugins::HostServices{offline, clock});
      json info = {{"info", info_to_json(plugin->info())}};
      note_activity("in deinit() (init() had succeeded)");
      plugin.reset();
      note_activity("");
      return info;
    } catch (const PluginLoadError& e) {
      return {{"error", e.what()}};
    }
  });
  if (result.contains("error")) return fail(result["error"].get<std::string>());
  const json& info = result.at("info");
  ctx.set_plugin_info(info);
  return pass("init() succeeded: " + info.value("id", std::string()) + " " +
              info.value("version", std::string()));
}

}  // namespace

std::vector<Check> static_checks() {
  return {
      {"elf_shared_object", "static", 1, Needs::kNothing,
       "the file exists and is a 64-bit ELF shared object for this machine", elf_shared_object},
      {"entry_symbol_exported", "static", 1, Needs::kNothing,
       "backhaul_entry is in the dynamic symbol table, global, visible, a data object",
       entry_symbol_exported},
      {"exports_only_entry", "static", 5, Needs::kNothing,
       "backhaul_entry is the only symbol the dynamic symbol table exports", exports_only_entry},
      {"library_loads", "static", 1, Needs::kNothing,
       "dlopen(RTLD_NOW) succeeds: no unresolved symbols, constructors do not crash",
       library_loads},
      {"entry_layout", "static", 1, Needs::kNothing,
       "struct_size, the magic number and the struct sizes of the magic block match the host",
       entry_layout},
      {"abi_version", "static", 1, Needs::kNothing,
       "same ABI major as the host, minor not newer, entry large enough for its minor",
       abi_version},
      {"function_table", "static", 1, Needs::kNothing, "every required function pointer is set",
       function_table},
      {"descriptor_layout", "static", 1, Needs::kNothing,
       "the descriptor is present, large enough, and its required strings are set",
       descriptor_layout},
      {"plugin_id", "static", 1, Needs::kNothing, "id matches [a-z][a-z0-9_-]*", plugin_id},
      {"plugin_version", "static", 1, Needs::kNothing, "version is a semantic version",
       plugin_version},
      {"entity_types", "static", 1, Needs::kNothing, "entity types are non-empty and unique",
       entity_types},
      {"default_entity_types", "static", 1, Needs::kNothing,
       "default entity types are unique and a subset of the supported ones", default_entity_types},
      {"config_schema_json", "static", 1, Needs::kNothing,
       "the config schema parses as JSON and is an object", config_schema_json},
      {"config_schema_keywords", "static", 3, Needs::kNothing,
       "the config schema's keywords are well-formed JSON Schema and its root type is object",
       config_schema_keywords},
      {"display_metadata", "static", 4, Needs::kNothing,
       "display name and description are not empty", display_metadata},
      {"loader_accepts", "static", 1, Needs::kNothing,
       "the host's loader accepts the plugin and init() succeeds (in a child)", loader_accepts},
  };
}

}  // namespace backhaul::validate

#include "core/validate/validator.h"

#include "core/common/errors.h"
#include "core/validate/checks.h"

namespace backhaul::validate {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<Check> all_checks() {
  std::vector<Check> checks;
  for (auto group : {static_checks, lifecycle_checks, conformance_checks, fault_checks}) {
    for (Check& c : group()) checks.push_back(c);
  }
  return checks;
}

void check_options(const ValidateOptions& options) {
  if (options.strictness < kMinStrictness || options.strictness > kMaxStrictness)
    throw ConfigError("strictness must be from 1 to 10, not " + std::to_string(options.strictness));
  if (options.timeout.count() <= 0) throw ConfigError("the timeout must be positive");
  if (options.threads < 1 || options.threads > 256)
    throw ConfigError("threads must be from 1 to 256, not " + std::to_string(options.threads));
}

// Why a check does not run, or nullopt when it does.
std::optional<std::string> skip_reason(const Check& check, const CheckContext& ctx,
                                       int strictness) {
  if (check.level > strictness)
    return "strictness " + std::to_string(strictness) + " < level " + std::to_string(check.level);
  if (check.needs != Needs::kNothing && !ctx.plugin_loaded())
    return "the plugin did not load (see loader_accepts)";
  if (check.needs == Needs::kFixtures && !ctx.fixtures())
    return "no fixtures (give --fixtures DIR with recorded exchanges)";
  return std::nullopt;
}

// Runs one check; whatever goes wrong in it is that check's FAIL, never the run's end.
Verdict run_check(const Check& check, CheckContext& ctx) {
  try {
    return check.run(ctx);
  } catch (const ChildFailure& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(std::string("validator error: ") + e.what());
  }
}

PluginSummary summary_of(const ValidateOptions& options, const CheckContext& ctx) {
  PluginSummary s;
  s.path = options.plugin_path.string();
  if (const auto& info = ctx.plugin_info()) {
    s.id = info->value("id", std::string());
    s.version = info->value("version", std::string());
    s.abi_version = info->value("abi", std::string());
  }
  return s;
}

}  // namespace

Report validate(const ValidateOptions& given) {
  check_options(given);
  const auto started = SteadyClock::now();
  // dlopen("github.so") would search the library path, not the working directory.
  ValidateOptions options = given;
  options.plugin_path = std::filesystem::absolute(given.plugin_path);
  std::optional<Fixtures> fixtures;
  if (options.fixtures_dir) fixtures = load_fixtures(*options.fixtures_dir);
  CheckContext ctx(options, std::move(fixtures));

  Report report;
  report.strictness = options.strictness;
  report.timeout = options.timeout;
  if (options.fixtures_dir) report.fixtures_dir = options.fixtures_dir->string();
  for (const Check& check : all_checks()) {
    const auto check_started = SteadyClock::now();
    CheckResult result{check.name, check.group, check.level, CheckStatus::kSkip, {}, {}};
    if (auto reason = skip_reason(check, ctx, options.strictness)) {
      result.reason = *reason;
    } else {
      Verdict verdict = run_check(check, ctx);
      result.status = verdict.status;
      result.reason = std::move(verdict.reason);
    }
    result.duration =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - check_started);
    if (options.on_result) options.on_result(result);
    report.checks.push_back(std::move(result));
  }
  report.plugin = summary_of(options, ctx);
  report.duration =
      std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - started);
  return report;
}

std::vector<CheckInfo> list_checks() {
  std::vector<CheckInfo> out;
  for (const Check& c : all_checks()) out.push_back({c.name, c.group, c.level, c.description});
  return out;
}

}  // namespace backhaul::validate

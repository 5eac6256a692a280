// `backhaul dlq list|stats|retry|ignore|purge`: dead letters (SPEC D5) through backhauld's admin
// API.
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/common/utf8.h"
#include "host/cli/admin_client.h"
#include "host/cli/cli.h"

namespace backhaul::cli {
namespace {

using nlohmann::json;

struct DlqOptions {
  AdminEndpoint endpoint;
  // Sent when given, even empty: the API refuses an empty status or kind rather than widen the
  // request to every letter, and reads an empty key as "no concurrency key".
  std::optional<std::string> status;
  std::optional<std::string> kind;
  std::optional<std::string> key;
  int64_t before = 0;
  int limit = 50;
  int64_t id = 0;
  bool all = false;
  int older_than_days = -1;
  bool json_output = false;
};

// The options a list was asked with, for the hint to its next page.
std::vector<std::pair<std::string, std::string>> list_options(const DlqOptions& o) {
  std::vector<std::pair<std::string, std::string>> options;
  if (o.status) options.emplace_back("--status", *o.status);
  if (o.kind) options.emplace_back("--kind", *o.kind);
  if (o.key) options.emplace_back("--key", *o.key);
  options.emplace_back("--limit", std::to_string(o.limit));
  return options;
}

void print_letters(const DlqOptions& o, const json& page) {
  std::printf("%-8s %-8s %-16s %-20s %-9s %-7s %s\n", "ID", "JOB", "KIND", "KEY", "STATUS",
              "RETRIES", "ERROR");
  for (const json& l : page.at("items")) {
    // Escaped, then cut on a character's boundary (a cut inside one showed a broken byte).
    std::string error = escape_controls(l.value("error", ""));
    if (error.size() > 60) error = cut_utf8(error, 57) + "...";
    std::printf("%-8lld %-8lld %-16s %-20s %-9s %-7lld %s\n",
                static_cast<long long>(l.at("id").get<int64_t>()),
                static_cast<long long>(l.at("jobId").get<int64_t>()), shown(l.at("kind")).c_str(),
                shown(l.at("concurrencyKey")).c_str(), shown(l.at("status")).c_str(),
                static_cast<long long>(l.at("retries").get<int64_t>()), error.c_str());
  }
  if (page.value("nextBefore", json()).is_number()) {
    std::printf("%s\n",
                next_page_hint(list_options(o), page.at("nextBefore").get<int64_t>()).c_str());
  }
}

void print(const DlqOptions& o, const json& body, const std::string& text) {
  if (o.json_output) {
    std::cout << body.dump(2) << "\n";
  } else {
    std::cout << text << "\n";
  }
}

void list(const DlqOptions& o) {
  std::string query;
  if (o.status) append_query(&query, "status", *o.status);
  if (o.kind) append_query(&query, "kind", *o.kind);
  if (o.key) append_query(&query, "key", *o.key);
  if (o.before > 0) append_query(&query, "before", std::to_string(o.before));
  append_query(&query, "limit", std::to_string(o.limit));
  const json page = AdminClient(o.endpoint).get("/v1/dead-letters" + query);
  if (o.json_output) {
    std::cout << page.dump(2) << "\n";
  } else {
    print_letters(o, page);
  }
}

void stats(const DlqOptions& o) {
  const json body = AdminClient(o.endpoint).get("/v1/dead-letters/stats");
  if (o.json_output) {
    std::cout << body.dump(2) << "\n";
    return;
  }
  std::printf("%-24s %-10s %s\n", "KIND", "STATUS", "COUNT");
  for (const json& row : body.at("items")) {
    std::printf("%-24s %-10s %lld\n", shown(row.at("kind")).c_str(),
                shown(row.at("status")).c_str(),
                static_cast<long long>(row.at("count").get<int64_t>()));
  }
  std::printf("total %lld\n", static_cast<long long>(body.at("total").get<int64_t>()));
}

void retry(const DlqOptions& o) {
  // Checked before the token, so a usage error is not reported as a missing token, and with the
  // parser's exit status, as its other usage errors. (An ID with --all, --limit or a filter is
  // refused by the parser.)
  if (o.id == 0 && !o.all) {
    throw CLI::ValidationError("dlq retry",
                               "give a dead letter ID, or --all (with filters and --limit)");
  }
  AdminClient client(o.endpoint);
  if (o.id > 0) {
    const json letter = client.post("/v1/dead-letters/" + std::to_string(o.id) + "/retry");
    print(o, letter,
          "dead letter " + std::to_string(o.id) + " retried (job " +
              std::to_string(letter.at("jobId").get<int64_t>()) + " queued)");
    return;
  }
  json body = {{"limit", o.limit}};
  if (o.status) body["status"] = *o.status;
  if (o.kind) body["kind"] = *o.kind;
  if (o.key) body["key"] = *o.key;
  const json result = client.post("/v1/dead-letters/retry", body);
  const int64_t retried = result.at("retried").get<int64_t>();
  print(o, result, "retried " + std::to_string(retried) + " dead letters");
  // The API retries at most `limit`: as many means more may match, which one run left unsaid.
  // (With --json on stderr, keeping stdout one JSON document.)
  if (retried >= o.limit) {
    std::fprintf(o.json_output ? stderr : stdout,
                 "the limit of %d was reached: more dead letters may match; run again, or give a "
                 "larger --limit\n",
                 o.limit);
  }
}

void ignore(const DlqOptions& o) {
  const json letter =
      AdminClient(o.endpoint).post("/v1/dead-letters/" + std::to_string(o.id) + "/ignore");
  print(o, letter, "dead letter " + std::to_string(o.id) + " ignored");
}

void purge(const DlqOptions& o) {
  const json result = AdminClient(o.endpoint)
                          .post("/v1/dead-letters/purge", {{"olderThanDays", o.older_than_days}});
  print(o, result,
        "purged " + std::to_string(result.at("purged").get<int64_t>()) +
            " resolved or ignored dead letters older than " + std::to_string(o.older_than_days) +
            " days");
}

}  // namespace

void add_dlq_command(CLI::App& app) {
  auto options = std::make_shared<DlqOptions>();
  CLI::App* dlq = app.add_subcommand("dlq",
                                     "dead letters of backhauld (list, stats, retry, "
                                     "ignore, purge)");
  dlq->require_subcommand(1);
  auto common = [&](CLI::App* command) {
    add_endpoint_options(*command, options->endpoint);
    command->add_flag("--json", options->json_output, "print the API's JSON answer");
  };
  auto filters = [&](CLI::App* command) {
    return std::vector<CLI::Option*>{
        command->add_option("--status", options->status, "pending, retrying, resolved or ignored"),
        command->add_option("--kind", options->kind, "job kind, e.g. backfill.entity"),
        command->add_option("--key", options->key, "concurrency key (installation id)")};
  };
  auto letter_id = [&](CLI::App* command) {
    return add_id_argument(*command, options->id, "dead letter");
  };

  CLI::App* list_cmd = dlq->add_subcommand("list", "list dead letters, newest first");
  common(list_cmd);
  filters(list_cmd);
  list_cmd->add_option("--before", options->before, "paging: only ids below this")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  list_cmd->add_option("--limit", options->limit, "at most this many")->capture_default_str();
  list_cmd->callback([options] { reading_answers([&] { list(*options); }, options->json_output); });

  CLI::App* stats_cmd = dlq->add_subcommand("stats", "counts by kind and status");
  common(stats_cmd);
  stats_cmd->callback(
      [options] { reading_answers([&] { stats(*options); }, options->json_output); });

  CLI::App* retry_cmd = dlq->add_subcommand("retry", "retry one dead letter, or many with --all");
  common(retry_cmd);
  std::vector<CLI::Option*> bulk = filters(retry_cmd);
  CLI::Option* one = letter_id(retry_cmd);
  bulk.push_back(retry_cmd->add_flag(
      "--all", options->all,
      "retry the pending letters matching the filters, at most --limit of them (said when "
      "reached: run again for more)"));
  bulk.push_back(retry_cmd
                     ->add_option("--limit", options->limit,
                                  "with --all: at most this many per run of the command")
                     ->capture_default_str());
  // "retry 12 --limit 5" would retry letter 12 and drop the limit unsaid.
  for (CLI::Option* option : bulk) one->excludes(option);
  retry_cmd->callback(
      [options] { reading_answers([&] { retry(*options); }, options->json_output); });

  CLI::App* ignore_cmd = dlq->add_subcommand("ignore", "mark a dead letter as ignored");
  common(ignore_cmd);
  letter_id(ignore_cmd)->required();
  ignore_cmd->callback(
      [options] { reading_answers([&] { ignore(*options); }, options->json_output); });

  CLI::App* purge_cmd = dlq->add_subcommand("purge", "delete resolved and ignored dead letters");
  common(purge_cmd);
  purge_cmd
      ->add_option("--older-than-days", options->older_than_days,
                   "only those last updated more than N days ago")
      ->required()
      ->check(CLI::Range(0, 36'500));
  purge_cmd->callback(
      [options] { reading_answers([&] { purge(*options); }, options->json_output); });
}

}  // namespace backhaul::cli

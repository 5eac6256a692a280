#include "reference_connector.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/mman.h>
#include <unistd.h>

namespace reference {
namespace {

using backhaul::sdk::Error;
using nlohmann::json;
namespace sdk = backhaul::sdk;

Config parse_config(std::string_view text) {
  Config config;
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return config;
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded())
    throw Error(BACKHAUL_INVALID_ARGUMENT, "reference config: not valid JSON");
  if (!doc.is_object()) throw Error(BACKHAUL_INVALID_ARGUMENT, "reference config: not an object");
  for (const auto& [key, value] : doc.items()) {
    if (key == "base_url" && value.is_string()) {
      config.base_url = value.get<std::string>();
    } else if (key == "page_size" && value.is_number_unsigned() && value.get<int>() >= 1) {
      config.page_size = value.get<int>();
    } else {
      throw Error(BACKHAUL_INVALID_ARGUMENT, "reference config: bad key \"" + key + "\"");
    }
  }
  return config;
}

int64_t header_int(const sdk::HttpResponse& r, std::string_view name, int64_t fallback) {
  auto value = r.header(name);
  if (!value) return fallback;
  try {
    return std::stoll(std::string(*value));
  } catch (const std::exception&) {
    return fallback;
  }
}

// The status mapping of SPEC C1/C2, for this API.
[[noreturn]] void throw_for_status(const sdk::HttpResponse& r, const std::string& what) {
  const int status = r.status();
  const std::string message = "reference: HTTP " + std::to_string(status) + " for " + what;
  const bool listing = what.find("?limit=") != std::string::npos;
  const bool wrong_401 =
      kDefect == Defect::kWrong401 ||
      (kDefect == Defect::kLate401 && what.find("&page=") != std::string::npos) ||
      (kDefect == Defect::kSecond401 && listing) ||
      (kDefect == Defect::kNote401 && what.find("/notes") != std::string::npos);
  if (status == 401) throw Error(wrong_401 ? BACKHAUL_FATAL : BACKHAUL_AUTH_EXPIRED, message);
  if (status == 403 || status == 429) {
    if (header_int(r, "x-ratelimit-remaining", -1) == 0 && r.header("x-ratelimit-reset")) {
      const int64_t wait = header_int(r, "x-ratelimit-reset", 0) * 1000 - sdk::Host::now_ms();
      throw Error(BACKHAUL_RATE_LIMITED, message, wait > 0 ? wait : 0);
    }
    if (r.header("retry-after"))
      throw Error(BACKHAUL_RATE_LIMITED, message, header_int(r, "retry-after", 60) * 1000);
    if (status == 429) throw Error(BACKHAUL_RATE_LIMITED, message, 60'000);
    throw Error(BACKHAUL_FATAL, message);
  }
  if (status >= 500 && kDefect == Defect::kLate500 && what.find("&page=") != std::string::npos)
    throw Error(BACKHAUL_FATAL, message);
  if (status >= 500 && kDefect == Defect::kOddStatus)
    throw Error(static_cast<backhaul_status_t>(42), message);
  if (kDefect == Defect::kForgedLines)
    throw Error(status >= 500 ? BACKHAUL_RETRYABLE : BACKHAUL_FATAL,
                message + "\nPASS  faults       fault_forged                      all good");
  if (status >= 500) throw Error(BACKHAUL_RETRYABLE, message);
  throw Error(BACKHAUL_FATAL, message);
}

sdk::HttpResponse get(const std::string& url, std::string_view token) {
  sdk::HttpRequest request;
  request.url = url;
  request.headers = {{"Authorization", "Bearer " + std::string(token)}};
  request.timeout_ms = 10'000;
  try {
    return sdk::Host::http(request);
  } catch (const sdk::HostError& e) {
    throw Error(BACKHAUL_RETRYABLE, "reference: GET " + url + " failed: " + e.what());
  }
}

int page_number(const std::optional<std::string_view>& cursor) {
  if (!cursor) return 1;
  if (cursor->substr(0, 5) == "page:") {
    std::string digits(cursor->substr(5));
    if (kDefect == Defect::kTokenCursor) digits = digits.substr(0, digits.find('@'));
    if (!digits.empty() && digits.size() < 9 &&
        digits.find_first_not_of("0123456789") == std::string::npos)
      return std::stoi(digits);
  }
  throw Error(BACKHAUL_INVALID_ARGUMENT, "reference: corrupt cursor");
}

std::string delivery_id(const sdk::FetchRequest& request, const json& item) {
  std::string id = "backfill-" + std::string(request.unit.installation_id) + "-" +
                   std::string(request.unit.resource_id) + "-" + std::string(request.entity_type);
  if (kDefect != Defect::kDuplicateIds) id += "-" + item.at("id").dump();
  if (kDefect == Defect::kRandomIds) {
    static std::random_device rng;
    id += "-" + std::to_string(rng());
  }
  return id;
}

bool misbehaves_in_fetch() {
  switch (kDefect) {
    case Defect::kCrashInFetch:
    case Defect::kHang:
    case Defect::kExit:
    case Defect::kMemoryHog:
      return true;
    default:
      return false;
  }
}

}  // namespace

void misbehave() {
  switch (kDefect) {
    case Defect::kCrashInFetch:
    case Defect::kSegvAlways: {
      volatile uintptr_t address = 16;  // volatile: a real store, not a compiler-made trap
      *reinterpret_cast<volatile int*>(address) = 1;
      break;
    }
    case Defect::kHang: {
      volatile uint64_t spin = 0;
      for (;;) spin = spin + 1;
    }
    case Defect::kExit:
      std::exit(3);
    case Defect::kMemoryHog: {
      static std::vector<std::unique_ptr<char[]>> hoard;
      constexpr size_t kChunk = size_t{32} << 20;
      for (;;) {
        hoard.push_back(std::make_unique<char[]>(kChunk));
        std::memset(hoard.back().get(), 1, kChunk);
      }
    }
    default:
      break;
  }
  std::abort();
}

ReferenceConnector::ReferenceConnector(std::string_view config_json)
    : config_(parse_config(config_json)) {}

void ReferenceConnector::validate_config(std::string_view config_json) {
  parse_config(config_json);
}

void ReferenceConnector::validate_scopes(const sdk::Unit& unit) {
  const std::string url = config_.base_url + "/v1/resources/" + std::string(unit.resource_id);
  sdk::HttpResponse r = get(url, unit.access_token);
  if (r.status() < 200 || r.status() >= 300) throw_for_status(r, "GET " + url);
}

sdk::Page ReferenceConnector::fetch_page(const sdk::FetchRequest& request) {
  if (misbehaves_in_fetch()) misbehave();
  if (request.entity_type != "ticket" && request.entity_type != "note")
    throw Error(BACKHAUL_INVALID_ARGUMENT, "reference: unknown entity type");
  const int page = page_number(request.cursor);
  std::string url = config_.base_url + "/v1/resources/" + std::string(request.unit.resource_id) +
                    "/" + std::string(request.entity_type) +
                    "s?limit=" + std::to_string(config_.page_size);
  if (page > 1) url += "&page=" + std::to_string(page);
  if (kDefect == Defect::kSecond401) validate_scopes(request.unit);
  sdk::Page out;
  if (kDefect == Defect::kEndless) {
    try {
      fill(request, url, out);
    } catch (const Error&) {
      // Past the last page: an empty page that still promises another.
    }
    out.next_cursor = "page:" + std::to_string(page + 1);
    return out;
  }
  if (kDefect == Defect::kLogsToken) {
    sdk::Host::log(BACKHAUL_LOG_DEBUG, "reference: GET " + url + " with token " +
                                           std::string(request.unit.access_token));
  }
  fill(request, url, out);
  if (kDefect == Defect::kRepeatCursor && request.cursor && out.next_cursor)
    out.next_cursor = std::string(*request.cursor);
  if (kDefect == Defect::kTokenCursor && out.next_cursor)
    *out.next_cursor += "@" + std::string(request.unit.access_token);
  return out;
}

void ReferenceConnector::fill(const sdk::FetchRequest& request, const std::string& url,
                              sdk::Page& out) const {
  if (kDefect == Defect::kLate500 && sdk::Host::now_ms() < limited_until_ms_) {
    throw Error(BACKHAUL_RATE_LIMITED, "reference: rate limited (remembered)",
                limited_until_ms_ - sdk::Host::now_ms());
  }
  sdk::HttpResponse r = get(url, request.unit.access_token);
  if (r.status() < 200 || r.status() >= 300) {
    try {
      throw_for_status(r, "GET " + url);
    } catch (const Error& e) {
      if (kDefect == Defect::kLate500 && e.status() == BACKHAUL_RATE_LIMITED)
        limited_until_ms_ = sdk::Host::now_ms() + e.retry_after_ms();
      throw;
    }
  }
  json doc = json::parse(r.body(), nullptr, false);
  if (!doc.is_object() || !doc.contains("items") || !doc["items"].is_array())
    throw Error(BACKHAUL_RETRYABLE, "reference: malformed response from GET " + url);
  out.raw_count = doc["items"].size();
  for (const json& item : doc["items"]) {
    if (!item.is_object() || !item.contains("id"))
      throw Error(BACKHAUL_RETRYABLE, "reference: item without id from GET " + url);
    json payload = {{"action", "backfill"},
                    {"entity", request.entity_type},
                    {"item", item},
                    {"resource", {{"id", request.unit.resource_id}}}};
    std::string text = payload.dump();
    if (kDefect == Defect::kNulPayload) text += std::string("\0x", 2);
    out.events.push_back({delivery_id(request, item), std::string(request.entity_type), text});
  }
  const json& next = doc.value("next_page", json());
  if (next.is_number_unsigned()) out.next_cursor = "page:" + next.dump();
}

namespace {
const char* const kEntityTypes[] = {"ticket", "note"};
const char* const kDefaultTypes[] = {"ticket"};
}  // namespace

const backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t),
    "reference",
    "1.0.0",
    "Reference",
    "Tickets and notes from a made-up ticketing API (validator test plugin).",
    kEntityTypes,
    2,
    kDefaultTypes,
    1,
    R"({"type":"object","additionalProperties":false,)"
    R"("properties":{"base_url":{"type":"string"},"page_size":{"type":"integer","minimum":1}}})"};

// --- raw functions ------------------------------------------------------------------------------

backhaul_status_t crash_validate_config(backhaul_string_t, backhaul_error_t*) { misbehave(); }
backhaul_status_t crash_create(backhaul_string_t, backhaul_instance_t**, backhaul_error_t*) {
  misbehave();
}
backhaul_status_t crash_validate_scopes(backhaul_instance_t*, const backhaul_unit_t*,
                                        backhaul_error_t*) {
  misbehave();
}
backhaul_status_t crash_fetch_page(backhaul_instance_t*, const backhaul_fetch_request_t*,
                                   backhaul_page_t**, backhaul_error_t*) {
  misbehave();
}

void leaky_release_page(backhaul_instance_t*, backhaul_page_t*) {}

namespace {
// One page object shared by every call: each fetch overwrites what the host still holds.
struct StaticPage {
  backhaul_page_t page{};
  std::vector<std::string> strings;
  std::vector<backhaul_event_t> events;
  std::string cursor;
};
}  // namespace

backhaul_status_t reusing_fetch_page(backhaul_instance_t* instance,
                                     const backhaul_fetch_request_t* request,
                                     backhaul_page_t** page, backhaul_error_t* error) {
  static StaticPage shared;
  backhaul_page_t* fresh = nullptr;
  const backhaul_status_t status = Trampolines::fetch_page(instance, request, &fresh, error);
  if (status != BACKHAUL_OK) return status;
  shared.strings.clear();
  shared.strings.reserve(fresh->event_count * 3);
  shared.events.assign(fresh->event_count, backhaul_event_t{});
  auto keep = [&](backhaul_string_t s) -> backhaul_string_t {
    shared.strings.emplace_back(s.data, s.size);
    return {shared.strings.back().data(), shared.strings.back().size()};
  };
  for (size_t i = 0; i < fresh->event_count; ++i) {
    shared.events[i] = {keep(fresh->events[i].delivery_id), keep(fresh->events[i].event_type),
                        keep(fresh->events[i].payload_json)};
  }
  shared.page = *fresh;
  shared.page.events = shared.events.data();
  if (fresh->next_cursor.data) {
    shared.cursor.assign(fresh->next_cursor.data, fresh->next_cursor.size);
    shared.page.next_cursor = {shared.cursor.data(), shared.cursor.size()};
  }
  Trampolines::release_page(instance, fresh);
  *page = &shared.page;
  return BACKHAUL_OK;
}

void reusing_release_page(backhaul_instance_t*, backhaul_page_t*) {}

// kShortPage: the page's struct_size member alone, in the last 8 bytes of a page of memory (aligned
// as a page must be: UBSan refuses a misaligned one) whose next page cannot be read: a host that
// reads a member past those 8 bytes crashes.
backhaul_status_t short_fetch_page(backhaul_instance_t*, const backhaul_fetch_request_t*,
                                   backhaul_page_t** page, backhaul_error_t*) {
  const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* memory =
      ::mmap(nullptr, 2 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) std::abort();
  char* guard = static_cast<char*>(memory) + size;
  if (::mprotect(guard, size, PROT_NONE) != 0) std::abort();
  const uint32_t struct_size = sizeof(uint32_t);
  char* at = guard - alignof(backhaul_page_t);
  std::memcpy(at, &struct_size, sizeof struct_size);
  *page = reinterpret_cast<backhaul_page_t*>(at);
  return BACKHAUL_OK;
}

void short_release_page(backhaul_instance_t*, backhaul_page_t* page) {
  if (!page) return;
  const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  char* start = reinterpret_cast<char*>(page) + alignof(backhaul_page_t) - size;
  ::munmap(start, 2 * size);
}

}  // namespace reference

extern "C" backhaul_status_t reference_throwing_fetch_page(backhaul_instance_t*,
                                                           const backhaul_fetch_request_t*,
                                                           backhaul_page_t**, backhaul_error_t*) {
  throw std::runtime_error("reference: fetch_page exploded");
}

// A small, correct connector for a made-up ticketing API, built once as is (the validator must
// pass it) and once per defect (the validator must fail it, for the right reason). The connector
// code is compiled once; each plugin's entry.cpp picks its defect (kDefect) and, for defects below
// the C++ layer, the raw functions its backhaul_entry points at.
//
// The API: GET {base_url}/v1/resources/{id}/{tickets|notes}?limit=N[&page=P] answers
// {"items":[{"id":101,...}],"next_page":2|null}; GET {base_url}/v1/resources/{id} checks access.
#pragma once

#include <string>
#include <string_view>

#include "backhaul/connector.hpp"

namespace reference {

enum class Defect {
  kNone = 1,
  kWrongAbi,      // declares ABI major 2
  kNoEntry,       // exports no backhaul_entry
  kCrashInFetch,  // fetch_page writes to address 16 (SIGSEGV)
  kSegvAlways,    // validate_config, create, validate_scopes and fetch_page all crash
  kEndless,       // every page has a next cursor, even past the last one
  kRepeatCursor,  // page 2 names itself as the next page
  kDuplicateIds,  // delivery ids leave out the item id
  kRandomIds,     // delivery ids end in a random number
  kWrong401,      // maps HTTP 401 to FATAL instead of AUTH_EXPIRED
  kLeaksPage,     // release_page frees nothing
  kReusesPage,    // fetch_page hands out one static page again and again
  kThrows,        // fetch_page is a raw C-linkage function that throws
  kHang,          // fetch_page never returns
  kExit,          // fetch_page calls exit(3)
  kMemoryHog,     // fetch_page allocates until memory runs out
  kNulPayload,    // payloads are a JSON object, a NUL and more bytes
  kOddStatus,     // HTTP 5xx maps to status 42, which the ABI does not define
  kForgedLines,   // error messages hold a line break and a forged report line
  kLate401,       // maps HTTP 401 to FATAL on the pages after the first
  kSecond401,     // checks access before each page (mapped right), then maps the list's 401 wrong
  kNote401,       // maps HTTP 401 to FATAL for notes (the second entity type)
  kLate500,       // maps HTTP 500 to FATAL on later pages; an instance that met a rate limit
                  // answers RATE_LIMITED until its reset without asking again
  kTokenCursor,   // next cursors end in "@" and the unit's access token
  kLogsToken,     // fetch_page logs the unit's access token (at debug level)
  kShortPage,     // fetch_page returns a page of only its struct_size member, which says so,
                  // followed by memory that cannot be read
};

// Defined by each plugin's entry.cpp.
extern const Defect kDefect;

struct Config {
  std::string base_url = "https://tickets.example.com";
  int page_size = 50;
};

class ReferenceConnector final : public backhaul::sdk::Connector {
 public:
  explicit ReferenceConnector(std::string_view config_json);
  static void validate_config(std::string_view config_json);
  void validate_scopes(const backhaul::sdk::Unit& unit) override;
  backhaul::sdk::Page fetch_page(const backhaul::sdk::FetchRequest& request) override;

 private:
  void fill(const backhaul::sdk::FetchRequest& request, const std::string& url,
            backhaul::sdk::Page& out) const;
  Config config_;
  mutable int64_t limited_until_ms_ = 0;  // kLate500
};

extern const backhaul_descriptor_t kDescriptor;
using Trampolines = backhaul::sdk::detail::Trampolines<ReferenceConnector>;

// Does what kDefect says instead of the work (crash, hang, exit, allocate); never returns.
[[noreturn]] void misbehave();

// Raw entry functions for the defects below the C++ layer.
backhaul_status_t crash_validate_config(backhaul_string_t, backhaul_error_t*);
backhaul_status_t crash_create(backhaul_string_t, backhaul_instance_t**, backhaul_error_t*);
backhaul_status_t crash_validate_scopes(backhaul_instance_t*, const backhaul_unit_t*,
                                        backhaul_error_t*);
backhaul_status_t crash_fetch_page(backhaul_instance_t*, const backhaul_fetch_request_t*,
                                   backhaul_page_t**, backhaul_error_t*);
void leaky_release_page(backhaul_instance_t*, backhaul_page_t*);
backhaul_status_t reusing_fetch_page(backhaul_instance_t*, const backhaul_fetch_request_t*,
                                     backhaul_page_t**, backhaul_error_t*);
void reusing_release_page(backhaul_instance_t*, backhaul_page_t*);
backhaul_status_t short_fetch_page(backhaul_instance_t*, const backhaul_fetch_request_t*,
                                   backhaul_page_t**, backhaul_error_t*);
void short_release_page(backhaul_instance_t*, backhaul_page_t*);

}  // namespace reference

// A plain C-linkage function that throws: what a connector written without the C++ layer's
// noexcept trampolines does when its C++ internals fail.
extern "C" backhaul_status_t reference_throwing_fetch_page(backhaul_instance_t*,
                                                           const backhaul_fetch_request_t*,
                                                           backhaul_page_t**, backhaul_error_t*);

// The header-only C++ layer, called through its C trampolines exactly as a host would.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "backhaul/connector.hpp"
#include "backhaul/host.hpp"
#include "backhaul/http_date.hpp"
#include "backhaul/json_depth.hpp"

extern "C" size_t backhaul_c_layout(size_t* out, size_t capacity);

namespace {

using backhaul::sdk::Error;

class TestConnector final : public backhaul::sdk::Connector {
 public:
  explicit TestConnector(std::string_view config) : config_(config) { validate_config(config); }
  static void validate_config(std::string_view config) {
    if (config == "bad") throw Error(BACKHAUL_INVALID_ARGUMENT, "config.bad is not allowed");
    if (config == "oom") throw std::bad_alloc();
  }
  void validate_scopes(const backhaul::sdk::Unit& unit) override {
    if (unit.access_token.empty()) throw Error(BACKHAUL_FATAL, "no token");
  }
  backhaul::sdk::Page fetch_page(const backhaul::sdk::FetchRequest& r) override {
    if (config_ == "long") throw Error(BACKHAUL_RETRYABLE, std::string(5000, 'x'));
    if (config_ == "limited") throw Error(BACKHAUL_RATE_LIMITED, "wait", 61'000);
    if (config_ == "logic") throw std::logic_error("oops");
    if (config_ == "int") throw 7;
    backhaul::sdk::Page page;
    page.events.push_back({"id-" + std::string(r.unit.resource_id), std::string(r.entity_type),
                           "{\"since\":" + std::to_string(r.since_unix_ms) + "}"});
    page.events.push_back({"id-2", "t", "{}"});
    page.next_cursor = r.cursor ? std::nullopt : std::optional<std::string>("c2");
    page.raw_count = 1;  // fewer than events: the layer must raise it to the event count
    page.rate_limit = backhaul::sdk::RateLimit{10, 100, 5000};
    return page;
  }

 private:
  std::string config_;
};

const char* const kTypes[] = {"t"};
const backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t), "test", "0.1.0", "Test", "", kTypes, 1, kTypes, 1, "{}"};

using T = backhaul::sdk::detail::Trampolines<TestConnector>;

backhaul_string_t s(std::string_view v) { return {v.data(), v.size()}; }

backhaul_instance_t* create(std::string_view config) {
  backhaul_instance_t* instance = nullptr;
  backhaul_error_t error{};
  EXPECT_EQ(T::create(s(config), &instance, &error), BACKHAUL_OK) << error.message;
  return instance;
}

backhaul_fetch_request_t request(const char* cursor = nullptr) {
  backhaul_fetch_request_t r{};
  r.struct_size = sizeof(r);
  r.unit.installation_id = s("i");
  r.unit.resource.id = s("r7");
  r.unit.access_token = s("tok");
  r.entity_type = s("t");
  r.since_unix_ms = 99;
  r.cursor = cursor ? s(cursor) : backhaul_string_t{nullptr, 0};
  return r;
}

TEST(ConnectorWrapperTest, PageCrossesTheAbiWithAllItsFields) {
  backhaul_instance_t* instance = create("ok");
  backhaul_fetch_request_t r = request();
  backhaul_page_t* page = nullptr;
  backhaul_error_t error{};
  ASSERT_EQ(T::fetch_page(instance, &r, &page, &error), BACKHAUL_OK);
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->struct_size, sizeof(backhaul_page_t));
  ASSERT_EQ(page->event_count, 2u);
  EXPECT_EQ(std::string(page->events[0].delivery_id.data, page->events[0].delivery_id.size),
            "id-r7");
  EXPECT_EQ(std::string(page->events[0].payload_json.data, page->events[0].payload_json.size),
            "{\"since\":99}");
  EXPECT_EQ(std::string(page->next_cursor.data, page->next_cursor.size), "c2");
  EXPECT_EQ(page->raw_count, 2u);
  EXPECT_EQ(page->has_rate_limit, 1);
  EXPECT_EQ(page->rate_limit.remaining, 10);
  EXPECT_EQ(page->rate_limit.reset_at_unix_ms, 5000);
  T::release_page(instance, page);

  backhaul_fetch_request_t last = request("c2");
  ASSERT_EQ(T::fetch_page(instance, &last, &page, &error), BACKHAUL_OK);
  EXPECT_EQ(page->next_cursor.data, nullptr);  // the last page
  T::release_page(instance, page);
  T::destroy(instance);
}

struct Case {
  const char* config;
  backhaul_status_t status;
  const char* message;
  int64_t retry_after_ms;
};

class ExceptionMappingTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExceptionMappingTest, EveryExceptionBecomesAStatusAndAMessage) {
  backhaul_instance_t* instance = create(GetParam().config);
  backhaul_fetch_request_t r = request();
  backhaul_page_t* page = reinterpret_cast<backhaul_page_t*>(0x1);  // must be reset to null
  backhaul_error_t error{};
  EXPECT_EQ(T::fetch_page(instance, &r, &page, &error), GetParam().status);
  EXPECT_EQ(page, nullptr);
  EXPECT_STREQ(error.message, GetParam().message);
  EXPECT_EQ(error.retry_after_ms, GetParam().retry_after_ms);
  T::destroy(instance);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ExceptionMappingTest,
    ::testing::Values(Case{"limited", BACKHAUL_RATE_LIMITED, "wait", 61'000},
                      Case{"logic", BACKHAUL_FATAL, "connector error: oops", 0},
                      Case{"int", BACKHAUL_FATAL, "connector error: unknown exception", 0}),
    [](const auto& param_info) { return std::string(param_info.param.config); });

TEST(ConnectorWrapperTest, LongMessagesAreTruncatedAndTerminated) {
  backhaul_instance_t* instance = create("long");
  backhaul_fetch_request_t r = request();
  backhaul_page_t* page = nullptr;
  backhaul_error_t error{};
  EXPECT_EQ(T::fetch_page(instance, &r, &page, &error), BACKHAUL_RETRYABLE);
  EXPECT_EQ(std::string(error.message), std::string(BACKHAUL_ERROR_MESSAGE_CAPACITY - 1, 'x'));
  T::destroy(instance);
}

TEST(ConnectorWrapperTest, CreateAndValidateConfigReportErrors) {
  backhaul_instance_t* instance = reinterpret_cast<backhaul_instance_t*>(0x1);
  backhaul_error_t error{};
  EXPECT_EQ(T::create(s("bad"), &instance, &error), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(instance, nullptr);
  EXPECT_STREQ(error.message, "config.bad is not allowed");
  EXPECT_EQ(T::validate_config(s("oom"), &error), BACKHAUL_RETRYABLE);
  EXPECT_STREQ(error.message, "out of memory");
  EXPECT_EQ(T::validate_config(s("{}"), &error), BACKHAUL_OK);
}

TEST(ConnectorWrapperTest, NullArgumentsAreInvalidNotCrashes) {
  backhaul_error_t error{};
  backhaul_page_t* page = nullptr;
  EXPECT_EQ(T::fetch_page(nullptr, nullptr, &page, &error), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(T::fetch_page(nullptr, nullptr, nullptr, &error), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(T::create(s("{}"), nullptr, &error), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(T::validate_scopes(nullptr, nullptr, &error), BACKHAUL_INVALID_ARGUMENT);
  T::release_page(nullptr, nullptr);  // ignored
}

TEST(ConnectorWrapperTest, ValidateScopesMapsErrors) {
  backhaul_instance_t* instance = create("ok");
  backhaul_unit_t unit{};
  unit.struct_size = sizeof(unit);
  backhaul_error_t error{};
  EXPECT_EQ(T::validate_scopes(instance, &unit, &error), BACKHAUL_FATAL);
  EXPECT_STREQ(error.message, "no token");
  unit.access_token = s("tok");
  EXPECT_EQ(T::validate_scopes(instance, &unit, &error), BACKHAUL_OK);
  T::destroy(instance);
}

TEST(ConnectorWrapperTest, InitRejectsMissingHost) {
  backhaul_error_t error{};
  EXPECT_EQ(T::init(nullptr, &error), 0);
  EXPECT_NE(std::string(error.message).find("host services"), std::string::npos);
  // Without init, host services throw instead of crashing.
  EXPECT_THROW(backhaul::sdk::Host::now_ms(), backhaul::sdk::HostError);
}

// Tokens of 8 bytes or more go wherever they are; shorter ones (test values) only where they
// stand alone, so that the rest of a message stays readable.
void release_nothing(const backhaul_host_t*, backhaul_http_response_t*) {}

// The host passes a header that came several times as several entries (host.h); header() sees
// only the first, which lost GitHub's rel="next" when it came in a second link line.
TEST(HttpResponseTest, HeadersListsEveryValueOfARepeatedNameInOrder) {
  const backhaul_http_header_t headers[] = {{s("link"), s("<a>; rel=\"first\"")},
                                            {s("content-type"), s("application/json")},
                                            {s("link"), s("<b>; rel=\"next\"")},
                                            {s("link"), s("")}};
  backhaul_http_response_t raw{};
  raw.status = 200;
  raw.headers = headers;
  raw.header_count = 4;
  backhaul_host_t host{};
  host.struct_size = sizeof(host);
  host.http_release = &release_nothing;
  const backhaul::sdk::HttpResponse response(&host, &raw);

  EXPECT_EQ(response.header("link"), std::string_view("<a>; rel=\"first\""));
  EXPECT_EQ(response.headers("link"),
            (std::vector<std::string_view>{"<a>; rel=\"first\"", "<b>; rel=\"next\"", ""}));
  EXPECT_EQ(response.headers("content-type"), std::vector<std::string_view>{"application/json"});
  EXPECT_TRUE(response.headers("etag").empty());
  EXPECT_TRUE(response.headers("Link").empty()) << "names are compared as given: lower case";
}

TEST(RedactSecretTest, ALongSecretGoesEverywhereAShortOneOnlyWhereItStandsAlone) {
  using backhaul::sdk::redact_secret;
  const std::string token = "ghp_0123456789abcdef";
  EXPECT_EQ(redact_secret("token " + token + " is bad; x" + token + "y", token),
            "token [redacted] is bad; x[redacted]y");
  EXPECT_EQ(redact_secret("Bad credentials", "e"), "Bad credentials");
  EXPECT_EQ(redact_secret("e: token e (e) is bad", "e"),
            "[redacted]: token [redacted] ([redacted]) is bad");
  EXPECT_EQ(redact_secret("t1-x t1_x xt1 t1", "t1"), "t1-x t1_x xt1 [redacted]");
  // A secret inside "[redacted]" itself does not make it loop or replace its own mark.
  EXPECT_EQ(redact_secret("d d", "d"), "[redacted] [redacted]");
  EXPECT_EQ(redact_secret("redactedredacted", "redacted"), "[redacted][redacted]");
  EXPECT_EQ(redact_secret("nothing here", ""), "nothing here");
}

// Nesting is counted outside strings only (escaped quotes and backslashes included), and a
// closing bracket too many does not let a deeper run through.
TEST(JsonDepthTest, CountsArraysAndObjectsOutsideStrings) {
  using backhaul::sdk::json_depth;
  using backhaul::sdk::kMaxJsonDepth;
  EXPECT_EQ(json_depth(R"({"a":[{"b":[1]}]})"), 4u);
  EXPECT_EQ(json_depth(R"(["[[[[", "{{{{"])"), 1u);
  EXPECT_EQ(json_depth(R"(["\"[[[", "\\", "x"])"), 1u) << "an escaped quote";
  EXPECT_EQ(json_depth(R"(["\\", [[1]]])"), 3u) << "an escaped backslash ends nothing";
  EXPECT_EQ(json_depth("]]]][[["), 3u) << "closings before do not lower the count below 0";
  EXPECT_EQ(json_depth(""), 0u);
  const std::string deep(kMaxJsonDepth, '[');
  EXPECT_LE(json_depth(deep), kMaxJsonDepth);
  EXPECT_GT(json_depth(deep + "{"), kMaxJsonDepth);
}

// RFC 9110's IMF-fixdate and nothing else: the obsolete forms, a wrong day name, an impossible
// date and surrounding whitespace are not dates.
TEST(HttpDateTest, ReadsTheImfFixdateOnly) {
  using backhaul::sdk::parse_imf_fixdate;
  EXPECT_EQ(parse_imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"), 784'111'777'000);
  EXPECT_EQ(parse_imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
  EXPECT_EQ(parse_imf_fixdate("Thu, 29 Feb 2024 23:59:60 GMT"), 1'709'251'200'000);
  for (const char* bad : {"", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
                          "Mon, 06 Nov 1994 08:49:37 GMT", "sun, 06 Nov 1994 08:49:37 GMT",
                          "Sun, 6 Nov 1994 08:49:37 GMT", "Thu, 29 Feb 2023 08:49:37 GMT",
                          "Sun, 06 Nov 1994 24:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 UTC",
                          " Sun, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08-49-37 GMT"}) {
    EXPECT_EQ(parse_imf_fixdate(bad), std::nullopt) << bad;
  }
}

TEST(AbiLayoutTest, CAndCppAgreeOnEveryStruct) {
  size_t c[32] = {};
  size_t n = backhaul_c_layout(c, 32);
  const size_t cpp[] = {
      sizeof(backhaul_string_t),
      sizeof(backhaul_error_t),
      sizeof(backhaul_host_t),
      sizeof(backhaul_http_request_t),
      sizeof(backhaul_http_response_t),
      sizeof(backhaul_descriptor_t),
      sizeof(backhaul_unit_t),
      sizeof(backhaul_fetch_request_t),
      sizeof(backhaul_event_t),
      sizeof(backhaul_page_t),
      sizeof(backhaul_entry_t),
      offsetof(backhaul_entry_t, descriptor),
      offsetof(backhaul_entry_t, get_extension),
      BACKHAUL_ENTRY_SIZE_V1_0,
  };
  ASSERT_EQ(n, sizeof(cpp) / sizeof(cpp[0]));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(c[i], cpp[i]) << "field " << i;
}

TEST(AbiLayoutTest, TheEntryIsAConstantTheHostCanCheckBeforeRunningCode) {
  // BACKHAUL_DEFINE_CONNECTOR builds a constant-initialized entry: a constexpr copy compiles.
  static constexpr backhaul_entry_t entry = {sizeof(backhaul_entry_t),
                                             BACKHAUL_ABI_VERSION_INIT,
                                             BACKHAUL_MAGIC_INIT,
                                             &kDescriptor,
                                             &T::init,
                                             &T::deinit,
                                             &T::validate_config,
                                             &T::create,
                                             &T::destroy,
                                             &T::validate_scopes,
                                             &T::fetch_page,
                                             &T::release_page,
                                             &T::get_extension};
  EXPECT_EQ(entry.magic.magic, BACKHAUL_ABI_MAGIC);
  EXPECT_EQ(entry.abi_version.major, BACKHAUL_ABI_VERSION_MAJOR);
}

}  // namespace

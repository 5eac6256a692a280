// The admin client's checks and texts (host/cli/admin_client.h) that need no daemon: the URL it
// takes, the errors it makes, the hints it prints.
#include "host/cli/admin_client.h"

#include <gtest/gtest.h>

namespace backhaul::cli {
namespace {

TEST(CheckAdminUrlTest, ABaseUrlIsTaken) {
  EXPECT_EQ(check_admin_url("http://127.0.0.1:8470"), "");
  EXPECT_EQ(check_admin_url("https://backhaul.internal/admin/"), "");
}

// Review: Poco drops a '?' or '#' with nothing after it, so "http://h/?" was taken, and its '?'
// then began every request's path.
TEST(CheckAdminUrlTest, AnyQuestionMarkOrHashIsRefused) {
  for (const std::string url :
       {"http://127.0.0.1:8470/?", "http://127.0.0.1:8470#", "http://h/?x=1", "http://h/#top"}) {
    EXPECT_EQ(check_admin_url(url),
              "'" + url + "' has a query or fragment ('?' or '#'); give the daemon's base URL");
  }
}

// Review: a password in BACKHAUL_URL was shown by --help; the API reads no user info, so a URL
// with some is refused, without repeating it.
TEST(CheckAdminUrlTest, UserInfoIsRefusedWithoutRepeatingIt) {
  for (const std::string url : {"http://admin:hunter2@127.0.0.1:8470", "http://hunter2@h/"}) {
    const std::string why = check_admin_url(url);
    EXPECT_NE(why.find("holds user info (user:password@), which the admin API does not read"),
              std::string::npos)
        << why;
    EXPECT_EQ(why.find("hunter2"), std::string::npos) << why;
  }
}

// Review: what() of an error of the daemon went to the terminal as it came, escape sequences
// included; the envelope (--json) keeps the text as it came.
TEST(AdminApiErrorTest, WhatIsEscapedTheEnvelopeIsNot) {
  const AdminApiError error(404, "NOT_FOUND", "gone\x1b[2J\nforged", nullptr, false);
  EXPECT_STREQ(error.what(), "NOT_FOUND: gone\\x1b[2J\\nforged");
  EXPECT_EQ(error.envelope()["error"]["message"], "gone\x1b[2J\nforged");
  EXPECT_EQ(error.envelope()["error"]["retryable"], false);
  EXPECT_EQ(error.retryable(), false);
  EXPECT_FALSE(AdminApiError(0, "UNREACHABLE", "x").envelope()["error"].contains("retryable"));
}

// Review: the hint to a list's next page dropped its filters ("more: --before 41"), so the page
// it led to was of the unfiltered list.
TEST(NextPageHintTest, KeepsTheOptionsOfTheListQuotedForAShell) {
  EXPECT_EQ(next_page_hint({{"--status", "failed"}, {"--limit", "20"}}, 41),
            "more: --status failed --limit 20 --before 41");
  EXPECT_EQ(next_page_hint({{"--kind", "a b"}, {"--key", ""}, {"--key", "it's"}}, 2),
            "more: --kind 'a b' --key '' --key 'it'\\''s' --before 2");
  EXPECT_EQ(next_page_hint({{"--kind", "k\x1b[2J"}}, 2), "more: --kind 'k\\x1b[2J' --before 2");
  EXPECT_EQ(next_page_hint({}, 9), "more: --before 9");
}

}  // namespace
}  // namespace backhaul::cli

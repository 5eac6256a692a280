#include "core/common/redact.h"

#include <string>

#include <gtest/gtest.h>

namespace backhaul {
namespace {

constexpr const char* kR = "[REDACTED]";

TEST(RedactTest, ReplacesEachGithubTokenPrefix) {
  for (const std::string prefix : {"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"}) {
    const std::string token = prefix + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0";
    EXPECT_EQ(redact("using " + token + " now"), std::string("using ") + kR + " now") << prefix;
    EXPECT_TRUE(contains_secret(token)) << prefix;
  }
}

TEST(RedactTest, ReplacesTokensOfAnyLength) {
  EXPECT_EQ(redact("x ghp_a y"), std::string("x ") + kR + " y");
  const std::string long_pat = "github_pat_11ABCDEFG0" + std::string(200, 'z') + "_Q9";
  EXPECT_EQ(redact("pat=" + long_pat), std::string("pat=") + kR);
}

TEST(RedactTest, ReplacesStatelessInstallationTokensWithDotsAndDashes) {
  const std::string jwt_style =
      "ghs_12345_eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjM0NSJ9.c2lnbmF0dXJl-LW_w";
  EXPECT_EQ(redact("token is " + jwt_style + ", expires soon"),
            std::string("token is ") + kR + ", expires soon");
  // A sentence's final period is not part of the token.
  EXPECT_EQ(redact("got ghs_abc.def."), std::string("got ") + kR + ".");
}

TEST(RedactTest, ReplacesVercelTokens) {
  EXPECT_EQ(redact("vcp_Zx9Yw8 and vca_Q1w2E3r4"), std::string(kR) + " and " + kR);
}

TEST(RedactTest, RedactsTokenAtEndOfString) {
  EXPECT_EQ(redact("ghp_abcdef"), kR);
  EXPECT_EQ(redact("key: vcp_x"), std::string("key: ") + kR);
}

TEST(RedactTest, ReplacesSeveralSecretsInOneString) {
  EXPECT_EQ(redact("a=ghp_1 b=gho_2 c=vca_3 https://u:p@h/x?token=t0k3n&page=2"),
            std::string("a=") + kR + " b=" + kR + " c=" + kR + " https://" + kR +
                "@h/x?token=" + kR + "&page=2");
}

TEST(RedactTest, LeavesPrefixInsideLongerWordsAlone) {
  EXPECT_EQ(redact("xghp_abc ghp_ vcp_"), "xghp_abc ghp_ vcp_");
}

TEST(RedactTest, ReplacesBearerCredentialCaseInsensitively) {
  EXPECT_EQ(redact("Authorization: Bearer eyJ.abc-def_ghi"),
            std::string("Authorization: Bearer ") + kR);
  EXPECT_EQ(redact("sent bearer abc123 to api"), std::string("sent bearer ") + kR + " to api");
  EXPECT_EQ(redact("BEARER   xyz"), std::string("BEARER   ") + kR);
}

TEST(RedactTest, ReplacesTokenSchemeCredentialInAuthorizationText) {
  EXPECT_EQ(redact("Authorization: token abc"), std::string("Authorization: token ") + kR);
  EXPECT_EQ(redact("authorization: TOKEN opaque_value"), std::string("authorization: TOKEN ") + kR);
  EXPECT_EQ(redact(R"({"authorization":"token abc","x":1})"),
            std::string(R"({"authorization":"token )") + kR + R"(","x":1})");
  EXPECT_EQ(redact(R"(\"Authorization\": \"token abc\")"),
            std::string(R"(\"Authorization\": \"token )") + kR + R"(\")");
  // Any scheme in Authorization-like text.
  EXPECT_EQ(redact("Authorization: Basic dXNlcjpwYXNz"), std::string("Authorization: Basic ") + kR);
}

TEST(RedactTest, ReplacesCredentialLookingValueAfterTokenWord) {
  EXPECT_EQ(redact("using token 0123abcdef4567"), std::string("using token ") + kR);
}

TEST(RedactTest, LeavesProseAboutTokensAndAuthorizationAlone) {
  for (const char* prose :
       {"token expired for installation 42", "refreshing token for repo owner/name",
        "authorization failed for user 7", "the bearer", "Token: none", "tokens", "tokenize me"}) {
    EXPECT_EQ(redact(prose), prose);
    EXPECT_FALSE(contains_secret(prose)) << prose;
  }
}

TEST(RedactTest, ReplacesUrlUserinfo) {
  EXPECT_EQ(redact("clone https://user:pa55@github.com/o/r.git"),
            std::string("clone https://") + kR + "@github.com/o/r.git");
  EXPECT_EQ(redact("https://x-access-token:ghs_abc@github.com"),
            std::string("https://") + kR + "@github.com");
  EXPECT_EQ(redact("redis://tok@127.0.0.1:6379"), std::string("redis://") + kR + "@127.0.0.1:6379");
}

TEST(RedactTest, LeavesUrlsWithoutUserinfoAlone) {
  const std::string url = "https://api.github.com/repos/o/r/issues?page=2&per_page=100#frag";
  EXPECT_EQ(redact(url), url);
  EXPECT_EQ(redact("see https://h/path/@user"), "see https://h/path/@user");
  EXPECT_EQ(redact("mail me at a@b.c"), "mail me at a@b.c");
}

TEST(RedactTest, ReplacesSensitiveQueryParameterValues) {
  EXPECT_EQ(redact("GET /x?access_token=abc&page=2"),
            std::string("GET /x?access_token=") + kR + "&page=2");
  EXPECT_EQ(redact("/x?page=1&token=t&password=p#top"),
            std::string("/x?page=1&token=") + kR + "&password=" + kR + "#top");
  EXPECT_EQ(redact("?secret=s&api_key=k&APIKEY=K"),
            std::string("?secret=") + kR + "&api_key=" + kR + "&APIKEY=" + kR);
  EXPECT_EQ(redact("url \"https://h/?token=abc\" done"),
            std::string("url \"https://h/?token=") + kR + "\" done");
}

TEST(RedactTest, LeavesOtherQueryParametersAlone) {
  for (const char* text : {"/x?tokens=1&my_token=2&page=3", "/x?token=", "a == b", "=token"}) {
    EXPECT_EQ(redact(text), text);
  }
}

TEST(RedactTest, ReturnsTextWithoutSecretsByteForByte) {
  std::string text = "plain log line: job 42 done in 17 ms, github rate 4999/5000 \t\n";
  text.push_back('\0');
  text += "\xff\xfe utf-8 \xc3\xa9 bytes ghx_ gh_ vc_ a://b";
  EXPECT_EQ(redact(text), text);
  EXPECT_FALSE(contains_secret(text));
  EXPECT_EQ(redact(""), "");
}

TEST(RedactTest, IsIdempotent) {
  const std::string once =
      redact("Authorization: Bearer abc https://u:p@h/?token=x ghp_y token 1234567890ab");
  EXPECT_EQ(redact(once), once);
  EXPECT_FALSE(contains_secret(once));
}

TEST(RedactTest, ContainsSecretMatchesRedact) {
  for (const char* text : {"ghp_x", "Bearer y", "https://a:b@c", "?password=z", "nothing here",
                           "token expired", "Authorization: token q"}) {
    EXPECT_EQ(contains_secret(text), redact(text) != text) << text;
  }
}

}  // namespace
}  // namespace backhaul

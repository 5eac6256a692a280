// A Transport that answers from recorded exchanges instead of the network: the connector tests and
// `backhaul plugin validate` use it. The fixture format is documented in sdk/README.md.
#pragma once

#include <atomic>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/http/http.h"

namespace backhaul::http {

struct Exchange {
  std::string method;  // upper case
  std::string url;  // absolute; matched exactly, except that query parameters may come in any order
  Response response;  // response.url is set to the request URL when the file leaves it out
  std::optional<std::string> error;  // set: the exchange fails with TransportError(error)
};

// Answers a request with the first recorded exchange of the same method and URL. An exchange may
// be answered any number of times. A request with no recording throws TransportError naming the
// URL (so a connector that builds a wrong URL fails loudly), and is remembered in unmatched().
// [thread-safe]
class ReplayTransport final : public Transport {
 public:
  ReplayTransport() = default;
  explicit ReplayTransport(std::vector<Exchange> exchanges);

  // Reads every *.json file of `dir` (sorted by name); each holds {"exchanges":[...]}. Throws
  // Error naming the file and the problem.
  static ReplayTransport from_directory(const std::filesystem::path& dir);
  // Parses one fixture document. Throws Error naming `origin` and the problem.
  static std::vector<Exchange> parse(std::string_view json, const std::string& origin);

  void add(Exchange exchange);
  Response perform(const Request& request) override;

  std::vector<Request> requests() const;  // every request seen, in order
  std::vector<std::string> unmatched() const;
  size_t request_count() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Exchange> exchanges_;
  std::vector<Request> requests_;
  std::vector<std::string> unmatched_;
};

// Canonical form of a URL for matching: query parameters sorted.
std::string canonical_url(std::string_view url);

}  // namespace backhaul::http
